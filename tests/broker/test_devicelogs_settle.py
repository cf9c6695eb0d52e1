"""DeviceLogs settles each device of a group commit when that device's high-water mark passes it
(issue 26), on a real store and group committer: one device held back (as behind a lagging
follower: ``LogStore.set_high_watermark``) neither holds the other device of the same batch nor
lets a session checkpoint forget the batch (``oldest_unrouted_us``: a checkpoint resumes from
before a record not yet routed), and settles, in log order, once its mark moves."""

from __future__ import annotations

import asyncio

from broker.devicelogs import DeviceLogs, PendingPublish
from broker.logrules import LogRules
from broker.message import Message
from commitlog.groupcommit import GroupCommitter
from commitlog.settings import LogSettings
from commitlog.store import LogStore


def test_a_held_device_settles_alone_and_keeps_the_batch_unrouted(tmp_path) -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        store = LogStore.open(str(tmp_path), LogSettings())
        committer = GroupCommitter(store, loop)
        settled: list[tuple[str, list[int], BaseException | None]] = []

        def on_durable(group: list[PendingPublish], exc: BaseException | None) -> None:
            settled.append((group[0][2].device, [m.offset for _, _, m in group], exc))

        logs = DeviceLogs(committer, LogRules(), on_durable, loop)

        def publish(device: str, payload: bytes) -> None:
            logs.append(device, Message(f"devices/{device}/t", payload, 1, False, None, None,
                                        "c"), None, None, None)

        publish("a", b"a0")
        publish("b", b"b0")
        await committer.wait_durable()
        assert sorted(settled) == [("a", [0], None), ("b", [0], None)]
        assert logs.oldest_unrouted_us() is None and logs.held == 0
        settled.clear()

        store.set_high_watermark("b", store.high_watermark("b"))  # b's mark held at 1
        publish("b", b"b1")
        publish("a", b"a1")
        publish("b", b"b2")
        await committer.wait_durable()
        assert settled == [("a", [1], None)], (
            f"only device a may settle while b's high-water mark is held: {settled}")
        assert logs.held == 2
        assert logs.oldest_unrouted_us() is not None, (
            "the batch still holds b's unrouted records: a checkpoint must not skip them")

        store.set_high_watermark("b", None)  # the mark moves to the durable end
        assert settled == [("a", [1], None), ("b", [1, 2], None)], settled
        assert logs.oldest_unrouted_us() is None and logs.held == 0
        await committer.close()

    asyncio.run(run())
