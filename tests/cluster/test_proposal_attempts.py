"""A metadata proposal Raft never answers is proposed again (cluster/metaclient.py
``Proposer``, ``ATTEMPT_TIMEOUT``), on a real 3-node Raft cluster.

pysyncobj can lose a command without answering: a follower forwards it to the leader it
knows and, when its connection to that leader is not up, drops it and keeps the callback until
it sees another leader. A placer that waited on that one attempt until ``append_timeout``
refused the held publishes of a group that had recovered in seconds (CI, 2026-11-26). The loss
is made here on purpose: a proxy in front of the node's metadata socket swallows the first
proposal (as the dropped forward does: no answer, the connection stays up). The same
compare-and-set must be proposed again and answered well before the deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
from collections.abc import Iterator

import pytest
from helpers.cluster import Cluster

from cluster.metaclient import ATTEMPT_TIMEOUT, Proposer
from meshmq.metadata_proc import metadata_socket

pytestmark = pytest.mark.timeout(180)
DEADLINE = 30.0  # far past one attempt (3 s): an answer only at the deadline is the defect


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("attempts"), n=3, raft=True)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


async def _swallowing_proxy(listen: str, target: str, swallowed: list[bytes]):
    """Forwards a metadata connection line by line, but drops the first proposal: the
    metadata process never sees it, so nothing ever answers it."""
    async def serve(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        sr, sw = await asyncio.open_unix_connection(target, limit=1 << 24)

        async def up() -> None:
            while line := await cr.readline():
                if b'"op":"propose"' in line and not swallowed:
                    swallowed.append(line)
                    continue
                sw.write(line)
                await sw.drain()

        async def down() -> None:
            while line := await sr.readline():
                cw.write(line)
                await cw.drain()
        try:
            await asyncio.gather(up(), down())
        finally:
            sw.close()
            cw.close()
    return await asyncio.start_unix_server(serve, path=listen, limit=1 << 24)


def test_a_proposal_raft_never_answers_is_proposed_again_before_the_deadline(
        trio: Cluster) -> None:
    real = metadata_socket(os.path.join(str(trio.nodes[0].workdir), "data"))
    # a compare-and-set whose repeat is harmless: releasing a claim nobody holds
    cmd = ["release_session", "attempts-nobody", "nobody/0", 1]

    async def run() -> tuple[object, float, dict, list]:
        swallowed: list[bytes] = []
        with tempfile.TemporaryDirectory(prefix="mq-attempts-") as tmp:
            listen = os.path.join(tmp, "proxy.sock")
            server = await _swallowing_proxy(listen, real, swallowed)
            stats = {"retries": 0}
            proposer = Proposer(listen, stats)
            started = time.monotonic()
            try:
                answer = await proposer.propose_until(cmd, started + DEADLINE)
            finally:
                proposer.close_now()
                server.close()
                with contextlib.suppress(Exception):
                    await server.wait_closed()
            return answer, time.monotonic() - started, stats, swallowed

    answer, took, stats, swallowed = asyncio.run(run())
    assert swallowed, "the proxy swallowed no proposal: this test proved nothing"
    assert not isinstance(answer, str), (
        f"a proposal Raft never answered must be proposed again and answered before the "
        f"{DEADLINE:.0f} s deadline; it ended with {answer!r} after {took:.1f} s")
    assert stats["retries"] >= 1, stats
    assert took < DEADLINE / 2, (
        f"answered only after {took:.1f} s: one attempt waited far past {ATTEMPT_TIMEOUT} s")
