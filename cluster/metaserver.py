"""The metadata process: one per node, hosting pysyncobj (Raft) beside the node's routers.

Why a process of its own (measured, ``../shared/notes/dependencies.md``): pysyncobj runs a
tick thread and pickles every message; inside a router, under proposal load, it held the GIL
long enough to push the router's event-loop lag p99 from ~2 ms to 14-43 ms. Routers reach it
over a local Unix socket (``MetadataClient``, ``cluster/metaclient.py``): batched proposals
and a stream of committed changes, JSON lines (metadata changes are rare next to publishes:
a device log is created once, a leader moves on a failure).

Raft settings, all measured there:

- **Batch mode only** (``appendEntriesUseBatch=True``): in non-batch mode a pysyncobj
  follower deletes its log suffix whenever ``prevLogIdx`` lags its last index, not only on a
  term conflict, and it truncated already-applied entries under load.
- Timers: heartbeat 0.01 s, tick 0.005 s, election 0.2-0.5 s: 11 ms commits from the
  leader, ~0.7 s to the next committed write after kill -9 of the leader.
- **Durable per batch**: pysyncobj's journal is an mmap flushed only at close (it survives
  kill -9, not a power cut), and its term/vote file is replaced without fsync. Here a
  transport wrapper fsyncs the journal before any message that claims its content leaves the
  process: a leader's APPEND_ENTRIES carrying entries (so no follower can acknowledge, and
  no majority form, over entries the leader could still lose) and a follower's success answer
  (so the leader counts only durable copies); term and vote are fsynced before a vote
  leaves. One fsync covers every entry appended since the last one: per batch, not per
  command (upstream PR #98 flushed per entry: 14k -> 40 req/s).
- Its transport pickles: it binds to the configured Raft address only and encrypts with the
  cluster secret (``password``, needs ``cryptography``).
- ``useFork=False``: log compaction serializes in this process's thread instead of forking a
  process that holds an asyncio loop and threads.

Run: ``python -m cluster.metaserver --self HOST:PORT --peer HOST:PORT ... --data-dir DIR
--socket PATH [--secret-file F]``; the node supervisor starts it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated
from pysyncobj.transport import TCPTransport
from pysyncobj.utility import TcpUtility, UtilityException

from cluster.controller import ControllerLoop
from cluster.metaclient import LINE_LIMIT
from cluster.metastate import MetadataState
from cluster.raftcontact import AGE_KEY, RaftContact

log = logging.getLogger("meshmq.metadata")

# pysyncobj's failure codes, named for a router's log and for its retry decision: every one
# but QUEUE_FULL/REQUEST_DENIED can hide a committed command (an unknown outcome), which is
# why the commands are compare-and-sets a retry cannot apply twice (metastate.py), but for
# the session registry's claim and save: a retry of one of those after an unknown outcome can
# still apply twice (a second epoch; a save after a newer one), known and left for a
# version-gated change of their form (cluster/sessionreg.py ``_propose``).
_FAILURES = {FAIL_REASON.QUEUE_FULL: "queue_full", FAIL_REASON.MISSING_LEADER: "no_leader",
             FAIL_REASON.DISCARDED: "unknown_outcome", FAIL_REASON.NOT_LEADER: "unknown_outcome",
             FAIL_REASON.LEADER_CHANGED: "unknown_outcome",
             FAIL_REASON.REQUEST_DENIED: "denied", FAIL_REASON.UNKNOWN_OUTCOME: "unknown_outcome"}


_PARTNER = "partner_node_status_server_"  # getStatus(): one key per other voter, 2 = connected
_LEADER_POLL = 0.1  # seconds between looks at the Raft leader (leader changes seen)
_LEADER_ASK = 1.0  # seconds to wait for the Raft leader's own status (node liveness)


class DurableTransport(TCPTransport):
    """pysyncobj's TCP transport, fsyncing the journal before a message vouches for it; it
    also tells ``RaftContact`` (cluster/raftcontact.py) what arrived from whom, and stamps
    each append_entries with this leader's majority age (the followers' lease clock)."""

    def send(self, node: Any, message: Any) -> bool:
        owner = self._syncObj
        if isinstance(message, dict) and isinstance(owner, MetadataNode):
            kind = message.get("type")
            if kind in ("append_entries", "next_node_idx"):
                owner.sync_journal()
                if kind == "append_entries":
                    message[AGE_KEY] = owner.contact.age(leader=True)
            elif kind in ("request_vote", "response_vote"):
                owner.sync_term()
        return super().send(node, message)

    def _onMessageReceived(self, node: Any, message: Any) -> None:
        owner = self._syncObj
        if isinstance(owner, MetadataNode):
            owner.contact.received(str(node.id), message)
        super()._onMessageReceived(node, message)


class MetadataNode(SyncObj):
    """The replicated object: ``state`` is what Raft replicates and snapshots."""

    def __init__(self, self_addr: str, peers: list[str], data_dir: str, secret: str | None,
                 on_change: Callable[[list, int], None]) -> None:
        # attributes set before SyncObj.__init__ are the process's own (never snapshotted)
        self.on_change = on_change
        self.contact = RaftContact(len(peers) + 1)
        self.lock = threading.Lock()  # the tick thread applies; the socket loop snapshots
        self.journal_path = os.path.join(data_dir, "raft.journal")
        self.dirty = False
        self.fsyncs = 0
        conf = SyncObjConf(
            appendEntriesUseBatch=True, autoTickPeriod=0.005, appendEntriesPeriod=0.01,
            raftMinTimeout=0.2, raftMaxTimeout=0.5, connectionTimeout=1.0,
            connectionRetryTime=0.5, leaderFallbackTimeout=1.0,
            journalFile=self.journal_path, fullDumpFile=os.path.join(data_dir, "raft.dump"),
            useFork=False, password=secret, bindAddress=self_addr,
            dynamicMembershipChange=False, commandsWaitLeader=False)
        super().__init__(self_addr, peers, conf=conf, transportClass=DurableTransport)
        self.state = MetadataState()
        self._watch_journal()

    # -- durability -------------------------------------------------------------------------
    def _watch_journal(self) -> None:
        """Mark the journal dirty on every change. pysyncobj (pinned 0.3.17) keeps it in a
        private attribute and has no hook; a version that renames it fails here at start-up,
        loudly, rather than running without fsync."""
        journal = self._SyncObj__raftLog  # type: ignore[attr-defined]
        for name in ("add", "clear", "deleteEntriesFrom", "deleteEntriesTo"):
            original = getattr(journal, name)

            def marked(*args: Any, _original: Callable = original) -> Any:
                self.dirty = True
                return _original(*args)
            setattr(journal, name, marked)
        self._journal = journal

    def sync_journal(self) -> None:
        if not self.dirty:
            return
        self.dirty = False
        self._journal.flush()  # msync(MS_SYNC) of the mapped journal
        fd = os.open(self.journal_path, os.O_RDONLY)
        try:
            os.fsync(fd)  # and its size, after a resize
        finally:
            os.close(fd)
        self.fsyncs += 1

    def sync_term(self) -> None:
        meta = self.journal_path + ".meta"
        try:
            fd = os.open(meta, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        dfd = os.open(os.path.dirname(meta) or ".", os.O_RDONLY)
        try:
            os.fsync(dfd)  # the rename that put it there
        finally:
            os.close(dfd)

    # -- the replicated method --------------------------------------------------------------
    @replicated
    def apply_batch(self, cmds: list) -> list:
        """One Raft entry per batch of commands (a router's proposals of one tick)."""
        results = []
        changes = []
        with self.lock:
            for cmd in cmds:
                applied, record, change = self.state.apply(cmd)
                results.append([applied, _jsonable(record)])
                if change is not None and change[0] == "changes":
                    changes.extend(_jsonable(c) for c in change[1])
                elif change is not None:
                    changes.append(_jsonable(change))
            if changes:  # records copied (_jsonable): a later command cannot change them
                self.on_change(changes, self.state.index)
        return results

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return _jsonable(self.state.snapshot())

    def controller_view(self) -> tuple[int, dict, dict, dict]:
        """What the controller plans from: shallow copies (records are replaced, never changed
        in place, by ``MetadataState``), taken under the lock the tick thread applies under."""
        with self.lock:
            st = self.state
            return st.index, dict(st.logs), dict(st.routers), dict(st.sessions)

    def majority_at(self) -> float:
        """When this voter last knew a Raft majority counted it in (cluster/raftcontact.py):
        the routers' leader lease runs from here (``time.monotonic()``, one clock per host)."""
        return self.contact.majority_at(leader=self._isLeader())


class MetadataServer:
    """The local socket: routers' proposals in, committed changes out."""

    def __init__(self, loop: asyncio.AbstractEventLoop, node_args: tuple, socket_path: str,
                 nodes: dict[str, str] | None = None, node_timeout: float = 1.0):
        self.loop = loop
        self.socket_path = socket_path
        self.watchers: set[asyncio.StreamWriter] = set()
        self.node = MetadataNode(*node_args, on_change=self._changed_threadsafe)
        self.secret: str | None = node_args[3]
        self.server: asyncio.AbstractServer | None = None
        # leaders seen by this voter (etcd's etcd_server_leader_changes_seen_total): a group
        # that keeps electing is unstable (a slow disk, a flapping link), even when every
        # election is quick. Polled: pysyncobj has no leader-change hook.
        self.leader_changes = 0
        self._leader: str | None = None
        self._polling: asyncio.Task | None = None
        # the controller (cluster/controller.py): only with the node map (node id -> Raft
        # address), which the node supervisor passes; a bare voter (tests) runs none
        self.controller: ControllerLoop | None = None
        if nodes:
            self_addr = node_args[0]
            self_node = next((n for n, a in nodes.items() if a == self_addr), None)
            if self_node is None:
                raise ValueError(f"--node: no node has this voter's address {self_addr}")
            self.controller = ControllerLoop(
                loop, self_node, nodes, node_timeout, self.node._isLeader,
                self.node.contact.last_heard, self.node.controller_view, self._propose_batch)

    async def start(self) -> None:
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass
        self.server = await asyncio.start_unix_server(self._client, path=self.socket_path,
                                                      limit=LINE_LIMIT)
        os.chmod(self.socket_path, 0o600)  # proposals change placement: this user only
        self._polling = self.loop.create_task(self._poll_leader())
        if self.controller is not None:
            self.controller.start()

    async def _poll_leader(self) -> None:
        while True:
            leader = self.node.getStatus().get("leader")
            leader = None if leader is None else str(leader)
            if leader is not None and leader != self._leader:
                self.leader_changes += 1
                log.info("raft leader is now %s (term %s)", leader, self.node.raftCurrentTerm)
            if leader is not None:
                self._leader = leader
            await asyncio.sleep(_LEADER_POLL)

    def _propose_batch(self, cmds: list, answer: Any) -> None:
        """The controller's proposals: one Raft entry for the whole batch."""
        def done(result: Any, error: int) -> None:
            answer(result, None if error == FAIL_REASON.SUCCESS
                   else _FAILURES.get(error, f"code {error}"))
        self.node.apply_batch(cmds, callback=done)

    def _changed_threadsafe(self, changes: list, index: int) -> None:
        self.loop.call_soon_threadsafe(self._changed, changes, index)

    def _changed(self, changes: list, index: int) -> None:
        line = _line({"changes": changes, "index": index})
        for w in list(self.watchers):
            w.write(line)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                raw = await reader.readline()
                if not raw:
                    return
                try:
                    req = json.loads(raw)
                    op = req["op"]
                except (ValueError, KeyError, TypeError):
                    writer.write(_line({"error": "malformed request: one JSON object per line "
                                                 "with an 'op' expected"}))
                    continue
                if op == "propose":
                    self._propose(req, writer)
                elif op == "watch":
                    # the snapshot is read on this loop while the tick thread may apply: the
                    # tick thread's changes come through call_soon_threadsafe after it, and a
                    # watcher ignores changes at or below the snapshot's index
                    writer.write(_line({"snapshot": self.node.snapshot()}))
                    self.watchers.add(writer)
                elif op == "status":
                    status = self.status()
                    if req.get("voters"):
                        status["voters"] = await self.voters(status)
                    writer.write(_line({"id": req.get("id"), "status": status}))
                elif op == "lease":  # polled by routers (cluster/lease.py): cheap on purpose
                    leader = self.node._getLeader()
                    writer.write(_line({"id": req.get("id"),
                                        "majority_at": _finite(self.node.majority_at()),
                                        "leader": None if leader is None else str(leader)}))
                else:
                    writer.write(_line({"id": req.get("id"), "error": f"unknown op {op!r}"}))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            self.watchers.discard(writer)
            writer.close()

    def _propose(self, req: dict, writer: asyncio.StreamWriter) -> None:
        rid = req.get("id")
        cmds = req.get("cmds")
        if not isinstance(cmds, list) or not all(isinstance(c, list) and c for c in cmds):
            writer.write(_line({"id": rid, "error": "'cmds' must be a list of non-empty lists"}))
            return

        def done(result: Any, error: int) -> None:
            reply = ({"id": rid, "results": result} if error == FAIL_REASON.SUCCESS
                     else {"id": rid, "failed": _FAILURES.get(error, f"code {error}")})
            self.loop.call_soon_threadsafe(self._reply, writer, reply)
        self.node.apply_batch(cmds, callback=done)

    def _reply(self, writer: asyncio.StreamWriter, reply: dict) -> None:
        if not writer.is_closing():
            writer.write(_line(_jsonable(reply)))

    def status(self) -> dict[str, Any]:
        st = self.node.getStatus()
        leader = st.get("leader")
        return {"self": str(st.get("self")), "leader": None if leader is None else str(leader),
                "term": st.get("raft_term"), "commit_index": st.get("commit_idx"),
                "last_applied": st.get("last_applied"),
                "state": {0: "follower", 1: "candidate", 2: "leader"}.get(st.get("state"),
                                                                          str(st.get("state"))),
                "has_quorum": bool(st.get("has_quorum")),
                "fsyncs": self.node.fsyncs, "index": self.node.state.index,
                "leader_changes": self.leader_changes,
                "connected": {k[len(_PARTNER):]: v == 2 for k, v in st.items()
                              if k.startswith(_PARTNER)},
                "majority_age": _finite(time.monotonic() - self.node.majority_at()),
                "controller": self._controller_status()}

    def _controller_status(self) -> dict[str, Any] | None:
        c = self.controller
        if c is None or c.since is None:
            return None
        return {"alive": sorted(c.alive), "offline_logs": len(c.offline), **c.stats}

    async def voters(self, status: dict[str, Any]) -> dict[str, Any]:
        """Each voter's liveness as the Raft *leader* sees it (connected to the leader or
        not): the view that decides whether a node's logs can be led, the same from every
        node. This voter leads: its own connections. Else it asks the leader over the Raft
        port (pysyncobj's ``status`` utility command, encrypted with the cluster secret),
        in a thread: a dead leader costs this request up to ``_LEADER_ASK`` seconds, never
        the tick thread. No leader, or no answer: every voter's liveness is unknown (None),
        and ``source`` says why."""
        me, leader = status["self"], status["leader"]
        if leader is None:
            return {"source": "none: no Raft leader", "alive": {me: None}}
        if leader == me:
            view = dict(status["connected"])
        else:
            try:
                remote = await self.loop.run_in_executor(None, self._ask_status, leader)
            except (UtilityException, OSError) as err:
                return {"source": f"none: the Raft leader {leader} did not answer ({err})",
                        "alive": {me: None}}
            view = {k[len(_PARTNER):]: v == 2 for k, v in remote.items()
                    if k.startswith(_PARTNER)}
        view[leader] = True
        return {"source": f"the Raft leader {leader}", "alive": view}

    def _ask_status(self, leader: str) -> dict[str, Any]:
        answer = TcpUtility(self.secret, timeout=_LEADER_ASK).executeCommand(leader, ["status"])
        if not isinstance(answer, dict):
            raise UtilityException(f"unexpected answer {answer!r}")
        return answer

    def close(self) -> None:
        if self._polling is not None:
            self._polling.cancel()
        if self.controller is not None:
            self.controller.stop()
        if self.server is not None:
            self.server.close()
        self.node.destroy()


def _line(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))


def _finite(x: float) -> float | None:
    """JSON has no infinity: never (-inf) is null."""
    return x if math.isfinite(x) else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="meshmq metadata process (Raft, pysyncobj)")
    ap.add_argument("--self", dest="self_addr", required=True, help="HOST:PORT of this voter")
    ap.add_argument("--peer", action="append", default=[], help="HOST:PORT of another voter")
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--socket", required=True, help="the Unix socket routers connect to")
    ap.add_argument("--secret-file", help="file holding the cluster secret (encrypts Raft); "
                    "else the environment variable MESHMQ_META_SECRET, if set")
    ap.add_argument("--parent-pid", type=int, default=0,
                    help="exit when this process (the node supervisor) is gone")
    ap.add_argument("--node", action="append", default=[], metavar="ID=HOST:PORT",
                    help="a node id and its voter's address, every node (this one included): "
                         "runs the controller (cluster/controller.py) while this voter leads")
    ap.add_argument("--node-timeout", type=float, default=1.0,
                    help="cluster.node_timeout: seconds unheard before a node is dead")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    os.makedirs(args.data_dir, exist_ok=True)
    secret = os.environ.pop("MESHMQ_META_SECRET", None) or None
    if args.secret_file:
        with open(args.secret_file) as f:
            secret = f.read().strip() or None
    loop = asyncio.new_event_loop()
    nodes = {}
    for item in args.node:
        node_id, sep, addr = item.partition("=")
        if not sep or not node_id or not addr:
            ap.error(f"--node {item!r}: expected ID=HOST:PORT")
        nodes[node_id] = addr
    server = MetadataServer(loop, (args.self_addr, args.peer, args.data_dir, secret),
                            args.socket, nodes, args.node_timeout)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if args.parent_pid:
        # a supervisor killed with -9 leaves no one to stop us: go too (as its routers do)
        def orphaned() -> None:
            if os.getppid() != args.parent_pid:
                log.warning("node supervisor %d is gone: metadata process exiting",
                            args.parent_pid)
                stop.set()
            else:
                loop.call_later(1.0, orphaned)
        loop.call_soon(orphaned)
    try:
        loop.run_until_complete(server.start())
        log.info("metadata process ready self=%s peers=%s socket=%s", args.self_addr,
                 args.peer, args.socket)
        loop.run_until_complete(stop.wait())
    finally:
        server.close()
        loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
