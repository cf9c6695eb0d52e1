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
import time
from collections.abc import Callable
from typing import Any

# The longest JSON line either side reads. asyncio's default (64 KiB) is smaller than a watch
# snapshot of a few hundred device logs and than a batch of a few hundred proposals (a router
# registering the logs on its disk, the controller failing a node's logs over): readline then
# raised ValueError and the stream never synced. A snapshot grows ~200 bytes a log, so 256 MiB
# is ~1M logs; the line is held in memory once either way.
LINE_LIMIT = 256 * 1024 * 1024

log = logging.getLogger("cluster.metaclient")

# The longest one proposal attempt waits before the same compare-and-set is proposed again.
# pysyncobj can lose a command without ever calling back: a follower forwards it to the
# leader it knows (``apply_command``) and keeps the callback until that leader answers or
# the follower sees a new leader; a message dropped on a reconnecting link, or a leader that
# lost it across a pause and stays leader, leaves it waiting for ever. One attempt waiting
# out the whole ``append_timeout`` turned a Raft group that recovered in 2 s into a refusal
# (seen in CI: voters SIGSTOPped, then resumed, the held placement refused at 60 s). A
# placement, an ISR change, a registration or a release is a compare-and-set
# (cluster/metastate.py), so a second proposal of one that did commit answers "already so"
# with the record: retrying is safe, waiting is not. (A session claim or save is not one:
# see ``propose_until``'s ``bounded``.) A commit takes ~11 ms; 3 s is far past one on a
# loaded box, and past an election (0.2-0.5 s).
ATTEMPT_TIMEOUT = 3.0
_RETRY = 0.1  # seconds between proposals while Raft has no leader (an election takes ~0.5 s)


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

        def abandoned(_waiter: asyncio.Future) -> None:
            # every caller of this batch stopped waiting (an attempt timed out: the Proposer
            # proposes the command again, on a new request): its answer may never come
            # (pysyncobj keeps a dropped forward's callback until the leader changes), so it
            # is forgotten now; a late answer finds no request and is ignored. Kept, one
            # request per timed-out attempt piled up for as long as the leader stayed.
            if not fut.done() and all(w.done() for _, w in batch):
                self._pending.pop(rid, None)
                fut.cancel()
        for _, waiter in batch:
            waiter.add_done_callback(abandoned)
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
    def waiting(self) -> int:
        """Requests sent and still awaiting their answer (bounded by the callers waiting:
        one abandoned by all of them is forgotten, ``_flush``)."""
        return len(self._pending)

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


class Proposer:
    """A module's proposals to this node's metadata process, each retried until Raft answers
    or its deadline passes. One connection, however many proposals wait on it; a connection
    that may be the one lost is dialled again once, not once per failed proposal.

    Shared by the placer (cluster/raftplace.py) and the session registry
    (cluster/sessionreg.py), which grew the same loop: an unknown outcome is proposed again
    as the same compare-and-set, never taken as applied (etcd's clients retry the same way on
    an ambiguous ``Txn``), and no attempt waits longer than ``ATTEMPT_TIMEOUT``."""

    def __init__(self, socket_path: str, stats: dict[str, int],
                 attempt_timeout: float = ATTEMPT_TIMEOUT) -> None:
        self.socket_path = socket_path
        self.stats = stats  # the caller's: "retries" is counted in it
        self.attempt_timeout = attempt_timeout
        self.client = MetadataClient(socket_path)
        self._dialing = asyncio.Lock()

    async def propose_until(self, cmd: list, deadline: float,
                            bounded: bool = True) -> tuple[bool, Any] | str:
        """Propose ``cmd`` until Raft answers (applied, record) or ``deadline`` (monotonic)
        passes: then why, a str, for the caller's refusal and log line. ``bounded=False``:
        one attempt may wait until the deadline, for a command whose repeat is not "already
        so" (``claim_session`` takes a new epoch each time, and the repeat's answer names
        this router as the previous holder, which would skip the real one's handover;
        ``save_session`` has no order against a newer save: cluster/sessionreg.py)."""
        why = "no answer"
        attempt = self.attempt_timeout if bounded else float("inf")
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return why
            client = self.client
            try:
                async with self._dialing:  # one connection, however many proposals wait
                    if not client.connected:
                        await asyncio.wait_for(client.connect(), left)
                return await asyncio.wait_for(client.propose(cmd), min(left, attempt))
            except MetadataUnavailable as err:
                why = {"no_leader": "the metadata Raft group has no leader (no majority of "
                                    "nodes reachable?)",
                       "unknown_outcome": "the metadata Raft group lost its leader mid-"
                                          "proposal"}.get(err.kind, f"metadata: {err}")
                if err.kind not in ("no_leader", "queue_full"):
                    self._redial(client)  # the connection may be the one lost
            except TimeoutError:  # before OSError, its base class
                # no answer in one attempt: Raft may have lost the command (see
                # ATTEMPT_TIMEOUT); the connection itself is not suspect. The next attempt
                # waits twice as long: an entry that truly takes longer to commit (a router
                # registering 100k logs at once) must not be proposed again every 3 s
                why = "the metadata Raft group did not commit in time (no majority?)"
                attempt *= 2
            except (OSError, ConnectionError) as err:
                why = f"this node's metadata process is not reachable ({err!r})"
                self._redial(client)
            self.stats["retries"] += 1
            log.debug("metadata proposal retried: %s", why, extra={"command": cmd[0]})
            await asyncio.sleep(min(_RETRY, max(0.0, deadline - time.monotonic())))

    def _redial(self, client: MetadataClient) -> None:
        """Drop ``client``'s connection for a new one, once (the proposals that failed on it
        together must not close each other's new connection)."""
        if self.client is client:
            client.close_now()
            self.client = MetadataClient(self.socket_path)

    def close_now(self) -> None:
        self.client.close_now()
