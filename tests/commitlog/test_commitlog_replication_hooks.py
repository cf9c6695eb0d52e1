"""The store's two hooks for the replica manager (cluster/replication.py): the commit tells a
listener which device logs' durable ends moved (a leader answers parked follower fetches and
moves its high-water mark then), and a leader refuses the acks its mark cannot reach in time
(``fail_high_watermark_waiters``: the records stay). Real stores on tmp_path."""

from __future__ import annotations

from commitlog.store import LogStore


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
