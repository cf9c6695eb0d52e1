"""The compacted state log (broker/statelog.py) on a real store and group committer: the newest
value per name wins, tombstones delete, and compaction rewrites the live values and moves the
log's start so a restart reads only those (and what came after)."""

from __future__ import annotations

import asyncio

from broker import statelog
from broker.statelog import StateLog
from commitlog.groupcommit import GroupCommitter
from commitlog.settings import LogSettings
from commitlog.store import LogStore

KEY = "#test-state"


def _values(log: StateLog) -> dict[str, bytes]:
    latest, _ = log.replay()
    return {name: bytes(rec.payload) for name, rec in latest.items()}


def test_compaction_keeps_the_state_and_drops_the_rest(tmp_path, monkeypatch):
    monkeypatch.setattr(statelog, "MIN_COMPACT_BYTES", 100)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        store = LogStore.open(str(tmp_path), LogSettings())
        committer = GroupCommitter(store, loop)
        log = StateLog(committer, KEY)
        for i in range(200):
            log.append(f"k{i % 10}", f"v{i}".encode())
        log.append("k3", b"")  # a tombstone
        await committer.wait_durable()
        want = {f"k{i}": f"v{190 + i}".encode() for i in range(10) if i != 3}
        assert _values(log) == want
        assert log.needs_compaction()
        log.compact((name, 0, None, value) for name, value in want.items())
        log.append("k0", b"after")  # a change after the snapshot
        await committer.wait_durable()
        assert not log.compacting
        start, end = store.log_range(KEY)
        assert (start, end) == (201, 211), "the start did not move to the snapshot"
        want["k0"] = b"after"
        assert _values(log) == want
        await committer.close()
        reopened = LogStore.open(str(tmp_path), LogSettings())
        try:
            again = StateLog(GroupCommitter(reopened, loop), KEY)
            assert reopened.log_range(KEY) == (201, 211)
            assert _values(again) == want
        finally:
            await again.committer.close()

    asyncio.run(run())
