"""Telling "the log Raft says I lead is missing or shorter than it was" (issue 24: a log whose
every replica was lost is reported as lost, never silently restarted at offset 0).

The problem: a node that comes back with an empty disk (replaced, ``rm -rf``, a lost volume)
finds Raft naming it the leader of logs it no longer has. Its store would append the next
publish at offset 0, and a reader that saved offset 100 would read other messages there, with
no error anywhere. A local file cannot tell, because the local files are what was lost.

The design: a **floor** per log, kept in Raft (its record's ``floor``): the leader's high-water
mark as it was a moment ago, so every offset below it was acknowledged. Raised in batches:
every ``cluster.log_floor_interval`` seconds each router proposes, in one Raft entry,
``raise_floor`` for every log it leads whose high-water mark passed its floor (a
compare-and-set that only raises: a retry or a late batch is "already so"). It costs one Raft
entry per router per interval while logs grow, nothing on the publish path. Kafka keeps the
same fact per replica on local disk (``recovery-point-offset-checkpoint``), which a lost disk
loses with the data; Raft keeps it where the disk is not.

The check (``LogFloors.admit``, called by the router's ``RaftFeed`` for every record it
learns, before the placement names this router leader): a record that names this router
leader with ``floor`` above the log's durable end here is a log that lost acknowledged
records. The router does not lead it (the placement marks it lost: publishes are refused as
not stored, reads fail), logs an ERROR naming the device, the floor, what is left and what to
do, and proposes ``mark_lost`` so every node reports it (``meshmq cluster status``,
``meshmq_logs_lost``). Today followers do not fetch yet, so the leader holds the only copy
and a short leader means a lost log; once they do, a short leader must instead hand
leadership to an in-sync replica that has the records (the ``failover`` controller) and
rejoin as a follower, and only a log with no such replica is lost.

What it cannot see: records acknowledged after the last floor was committed (at most one
interval's worth; the log is still reported lost when any floor was committed) and a log lost
before its first floor (it comes back empty at offset 0, as a new log would).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from cluster.metaclient import MetadataClient, MetadataUnavailable

log = logging.getLogger("cluster.logfloor")

_PROPOSE_TIMEOUT = 10.0  # seconds one batch may wait for Raft before the next round tries again


class LogFloors:
    """One router's floors: raised in batches, checked for every record learned."""

    def __init__(self, me: str, socket_path: str, records: dict[str, dict],
                 durable_end: Callable[[str], int], high_watermark: Callable[[str], int],
                 interval: float) -> None:
        self.me = me
        self.socket_path = socket_path
        self.records = records  # the RaftFeed's: every log record as Raft committed it
        self.durable_end = durable_end
        self.high_watermark = high_watermark
        self.interval = interval
        self.lost: dict[str, dict[str, Any]] = {}  # device -> {"floor", "end", "incarnation"}
        # the logs Raft names this router leader of (kept by ``admit``, which sees every record
        # learned): a round walks these, not every log of the cluster
        self.mine: set[str] = set()
        self.stats = {"floors_raised": 0, "batches": 0, "proposal_failures": 0}
        self._client: MetadataClient | None = None
        self._task: asyncio.Task | None = None

    # -- the check --------------------------------------------------------------------------
    def admit(self, device: str, rec: dict[str, Any]) -> bool:
        """Whether this router may take ``rec`` as it is: False for a log Raft records as lost
        (no router serves it), and for one it is named leader of with its records here
        short of the floor (reported once per incarnation, then marked lost in Raft)."""
        current = self.records.get(device, rec)  # ``rec`` may be older than what is known
        if current.get("leader") == self.me:
            self.mine.add(device)
        else:
            self.mine.discard(device)
        lost = rec.get("lost")
        if rec.get("leader") != self.me:
            # lost at its leader: refused here too, with the reason (not forwarded there)
            return not lost
        floor = int(rec.get("floor") or 0)
        end = self.durable_end(device)
        if not lost and end >= floor:
            return True
        known = self.lost.get(device)
        if known is None or known["incarnation"] != rec.get("incarnation"):
            self.lost[device] = {"floor": floor, "end": end,
                                 "incarnation": rec.get("incarnation"), "marked": bool(lost)}
            log.error("device log %r LOST: Raft recorded it acknowledged up to offset %d, but "
                      "this router (its leader) has %d records and no replica holds the rest. "
                      "Its publishes are refused and its reads fail; it is not restarted at "
                      "offset 0 (readers' saved offsets would point at other messages). "
                      "Restore this node's data directory from a backup and restart it; "
                      "`meshmq cluster status --device %s` shows the record", device, floor,
                      end, device, extra={"device": device, "floor": floor, "end": end,
                                          "router": self.me})
        return False

    # -- raising floors ---------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - closing anyway
                pass
        if self._client is not None:
            self._client.close_now()

    def due(self) -> list[list]:
        """The commands of one round: ``raise_floor`` for each log led here whose high-water
        mark passed its floor, ``mark_lost`` for each lost log Raft does not know is lost."""
        cmds: list[list] = []
        for device in list(self.mine):
            rec = self.records.get(device)
            if rec is None or rec.get("leader") != self.me:
                self.mine.discard(device)
                continue
            lost = self.lost.get(device)
            if lost is not None and lost["incarnation"] == rec.get("incarnation"):
                if not rec.get("lost"):
                    cmds.append(["mark_lost", device, rec["incarnation"], lost["floor"],
                                 lost["end"]])
                continue
            hw = self.high_watermark(device)
            if hw > int(rec.get("floor") or 0):
                cmds.append(["raise_floor", device, rec["incarnation"], hw])
        return cmds

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            cmds = self.due()
            if cmds:
                await self._propose(cmds)

    async def _propose(self, cmds: list[list]) -> None:
        """One batch (the client sends the commands of one tick as one Raft entry). A failure
        or an unknown outcome is left to the next round, which reads the records again."""
        try:
            if self._client is None or not self._client.connected:
                self._client = MetadataClient(self.socket_path)
                await asyncio.wait_for(self._client.connect(), _PROPOSE_TIMEOUT)
            answers = await asyncio.wait_for(asyncio.gather(
                *(self._client.propose(c) for c in cmds)), _PROPOSE_TIMEOUT)
        except (MetadataUnavailable, TimeoutError, OSError, ConnectionError) as err:
            self.stats["proposal_failures"] += 1
            log.warning("log floors not recorded in Raft this round (%r): tried again in "
                        "%.1f s", err, self.interval, extra={"logs": len(cmds)})
            if self._client is not None:
                self._client.close_now()
                self._client = None
            return
        self.stats["batches"] += 1
        for cmd, (applied, _rec) in zip(cmds, answers, strict=True):
            if applied and cmd[0] == "raise_floor":
                self.stats["floors_raised"] += 1
            elif applied:
                self.lost[cmd[1]]["marked"] = True
