"""The store's two hooks for the replica manager (cluster/replication.py): the commit tells a
listener which device logs' durable ends moved (a leader answers parked follower fetches and
moves its high-water mark then), and a leader refuses the acks its mark cannot reach in time
(``fail_high_watermark_waiters``: the records stay). Real stores on tmp_path."""

from __future__ import annotations

from commitlog.store import LogStore, LogTruncatedError
from commitlog.waiters import Watch


def _append(store: LogStore, key: str, payload: bytes) -> int:
    return store.append(key, 0, f"devices/{key}/t", 1, None, payload)


def test_the_commit_names_the_logs_whose_durable_end_moved(tmp_path) -> None:
    with LogStore.open(str(tmp_path / "log")) as store:
        moved: list[list[str]] = []
        store.durable_listener = moved.append
        _append(store, "a", b"1")
        _append(store, "b", b"2")
        store.flush_sync_commit()
        assert [sorted(m) for m in moved] == [["a", "b"]]
        _append(store, "b", b"3")
        store.flush_sync_commit()
        assert moved[-1] == ["b"]  # a did not move: not named
        store.durable_listener = None
        _append(store, "a", b"4")
        store.flush_sync_commit()
        assert len(moved) == 2


def test_failing_the_waiters_refuses_only_what_is_above_the_mark(tmp_path) -> None:
    with LogStore.open(str(tmp_path / "log")) as store:
        for k in range(4):
            _append(store, "d", b"%d" % k)
        store.flush_sync_commit()
        store.set_high_watermark("d", 2)  # a replicated mark: records 2 and 3 wait
        seen: dict[int, object] = {}
        for target in (2, 3, 4):
            store.when_high_watermark("d", target, lambda exc, t=target: seen.__setitem__(t, exc))
        assert seen == {2: None}
        boom = RuntimeError("not enough in-sync replicas")
        assert store.fail_high_watermark_waiters("d", boom) == 2
        assert seen == {2: None, 3: boom, 4: boom}
        assert store.durable_end("d") == 4  # the records stay in the log
        assert store.fail_high_watermark_waiters("d", boom) == 0
        assert store.fail_high_watermark_waiters("unknown", boom) == 0


def test_a_watch_outlives_the_refusal_of_the_acks_in_its_place(tmp_path) -> None:
    """A ``Watch`` (a refused record routed once committed: broker/ingest.py) is no ack: the
    refusal leaves it waiting, it fires in target order among the acks when the mark passes it,
    and a truncation still fails it. (Failed and registered again at every refusal, it was
    counted as a refused ack four times a second for as long as the mark stayed stuck.)"""
    with LogStore.open(str(tmp_path / "log")) as store:
        for k in range(6):
            _append(store, "d", b"%d" % k)
        store.flush_sync_commit()
        store.set_high_watermark("d", 1)
        order: list[tuple[str, int, object]] = []

        def waiter(kind: str, target: int):
            def call(exc: object) -> None:
                order.append((kind, target, exc))
            return Watch(call) if kind == "watch" else call

        for kind, target in (("watch", 2), ("ack", 3), ("watch", 4), ("ack", 5), ("watch", 6)):
            store.when_high_watermark("d", target, waiter(kind, target))
        boom = RuntimeError("not enough in-sync replicas")
        assert store.fail_high_watermark_waiters("d", boom) == 2  # the acks only
        assert order == [("ack", 3, boom), ("ack", 5, boom)]
        assert store.high_watermark_waiters == 3
        assert store.fail_high_watermark_waiters("d", boom) == 0  # nothing counted again
        order.clear()
        store.when_high_watermark("d", 3, waiter("ack", 3))  # a new ack between the watches
        store.set_high_watermark("d", 4)
        assert order == [("watch", 2, None), ("ack", 3, None), ("watch", 4, None)]
        order.clear()
        store.truncate("d", 5)  # the record the last watch waits for is gone
        assert [(k, t) for k, t, _ in order] == [("watch", 6)]
        assert isinstance(order[0][2], LogTruncatedError)
        assert store.high_watermark_waiters == 0
