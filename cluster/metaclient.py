"""A router's side of the metadata process (``cluster/metaserver.py``): asyncio, one Unix socket.

Proposals made during one loop tick go out as one request, so they become one Raft entry and
one fsync at every voter (group commit, as the commit log batches per tick). A watch is a
second connection that receives the whole state once, then every committed change.

A proposal ends in one of three ways, and the caller must tell them apart (an unknown
outcome is never a success, nor a failure): ``results`` (each command applied, or refused
with the record as it is), ``MetadataUnavailable(kind="no_leader"|"queue_full"|"denied")``
(not applied), or ``MetadataUnavailable(kind="unknown_outcome")`` (maybe applied: propose
the same compare-and-set again and read what it answers).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

# The longest JSON line either side reads. asyncio's default (64 KiB) is smaller than a watch
# snapshot of a few hundred device logs and than a batch of a few hundred proposals (a router
# registering the logs on its disk, the controller failing a node's logs over): readline then
# raised ValueError and the stream never synced. A snapshot grows ~200 bytes a log, so 256 MiB
# is ~1M logs; the line is held in memory once either way.
LINE_LIMIT = 256 * 1024 * 1024


class MetadataUnavailable(Exception):
    def __init__(self, kind: str, why: str = "") -> None:
        super().__init__(f"{kind}: {why}" if why else kind)
        self.kind = kind


class MetadataClient:
    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._batch: list[tuple[list, asyncio.Future]] = []
        self._next_id = 1
        self._reading: asyncio.Task | None = None

    async def connect(self) -> None:
        self._reader, self._writer = await asyncio.open_unix_connection(self.socket_path,
                                                                        limit=LINE_LIMIT)
        self._reading = asyncio.get_running_loop().create_task(self._read())

    async def propose(self, cmd: list) -> tuple[bool, Any]:
        """One command, sent with the others of this tick: (applied, record)."""
        fut = asyncio.get_running_loop().create_future()
        if not self._batch:
            asyncio.get_running_loop().call_soon(self._flush)
        self._batch.append((cmd, fut))
        return await fut

    async def status(self) -> dict[str, Any]:
        rid = self._new_id()
        fut = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        self._send({"op": "status", "id": rid})
        return (await fut)["status"]

    def _flush(self) -> None:
        batch, self._batch = self._batch, []
        rid = self._new_id()
        fut = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut

        def answered(f: asyncio.Future) -> None:
            reply = f.result() if not f.cancelled() and f.exception() is None else None
            for i, (_, waiter) in enumerate(batch):
                if waiter.done():
                    continue
                if reply is None:
                    waiter.set_exception(MetadataUnavailable(
                        "unknown_outcome", "the metadata process connection was lost"))
                elif "results" in reply:
                    applied, record = reply["results"][i]
                    waiter.set_result((applied, record))
                else:
                    waiter.set_exception(MetadataUnavailable(
                        reply.get("failed", "error"), reply.get("error", "")))
        fut.add_done_callback(answered)
        self._send({"op": "propose", "id": rid, "cmds": [c for c, _ in batch]})

    def _new_id(self) -> int:
        rid = self._next_id
        self._next_id += 1
        return rid

    def _send(self, obj: dict) -> None:
        if self._writer is None:
            raise MetadataUnavailable("no_connection", "connect() first")
        self._writer.write(json.dumps(obj, separators=(",", ":")).encode() + b"\n")

    async def _read(self) -> None:
        assert self._reader is not None
        try:
            while True:
                raw = await self._reader.readline()
                if not raw:
                    break
                msg = json.loads(raw)
                fut = self._pending.pop(msg.get("id"), None)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
        finally:
            lost = ConnectionError("metadata process connection lost")
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(lost)
            self._pending.clear()

    @property
    def connected(self) -> bool:
        """Connected and still reading answers (a lost connection answers nothing more: a
        caller dials a new client)."""
        return self._reading is not None and not self._reading.done()

    async def close(self) -> None:
        self.close_now()

    def close_now(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._reading is not None:
            self._reading.cancel()


async def watch(socket_path: str, on_snapshot: Callable[[dict], None],
                on_changes: Callable[[list, int], None]) -> None:
    """Stream the state: ``on_snapshot`` once, then ``on_changes`` for every committed batch
    past the snapshot, until the connection ends (the caller reconnects and starts over)."""
    reader, writer = await asyncio.open_unix_connection(socket_path, limit=LINE_LIMIT)
    try:
        writer.write(b'{"op":"watch"}\n')
        at = -1
        while True:
            raw = await reader.readline()
            if not raw:
                return
            msg = json.loads(raw)
            if "snapshot" in msg:
                at = msg["snapshot"]["index"]
                on_snapshot(msg["snapshot"])
            elif "changes" in msg and msg["index"] > at:
                at = msg["index"]
                on_changes(msg["changes"], msg["index"])
    finally:
        writer.close()


async def follow(socket_path: str, section: str, kind: str,
                 on_record: Callable[[str, Any], None], synced: asyncio.Event, what: str,
                 logger: logging.Logger, reconnect: float) -> None:
    """Keep one map of the state (``section`` in the snapshot, ``kind`` in the changes) fed
    to ``on_record(key, record)`` forever: the snapshot, then every change; when the stream
    ends (the metadata process restarted), reconnect after ``reconnect`` seconds and start
    over (``synced`` is set at each snapshot). The placement feed and the session registry
    both follow the state this way."""
    def snapshot(snap: dict) -> None:
        for key, rec in snap.get(section, {}).items():
            on_record(key, rec)
        synced.set()

    def changes(batch: list, _index: int) -> None:
        for change in batch:
            if change and change[0] == kind:
                on_record(change[1], change[2])

    while True:
        try:
            await watch(socket_path, snapshot, changes)
            why = "the stream ended"
        except (OSError, ValueError) as err:
            why = repr(err)
        # before the first snapshot the metadata process is still starting (the node starts
        # it beside its routers): not worth a warning every half second
        logger.log(logging.WARNING if synced.is_set() else logging.DEBUG,
                   "%s watch lost (%s): reconnecting in %.1f s; changes committed meanwhile "
                   "arrive with the next snapshot", what, why, reconnect,
                   extra={"socket": socket_path})
        await asyncio.sleep(reconnect)
