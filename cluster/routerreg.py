"""A router registers its process incarnation in Raft before it leads anything (issue 24):
KRaft's broker registration with an incarnation id (KIP-903).

Every router process draws 16 random bytes at start (``Mesh.incarnation``, the same id its
mesh links use); ``register_router(router id, incarnation hex, {"kept_logs"})`` records it in
the metadata state (cluster/metastate.py). Log records carry the incarnation of the process
elected to lead them (``leader_incarnation``), and a router leads a log only when that is its
own (``fenced``): so a router restarted after kill -9, or with its disk lost, never resumes
leading with what it has; the controller (cluster/controller.py) sees the new incarnation and
elects again. ``kept_logs`` (device logs on disk at start) tells the controller whether this
router may be re-elected as a log's last in-sync replica (see its docstring); ``damaged`` (the
logs whose recovery quarantined a corrupt record at this start) that it must not be re-elected
for those while another in-sync replica is alive (review 7).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

from cluster.metaclient import ATTEMPT_TIMEOUT, MetadataClient, MetadataUnavailable

log = logging.getLogger("cluster.routerreg")

_RETRY = 0.1


def fenced(rec: dict, router: str, incarnation: str | None) -> bool:
    """Whether ``router`` (this process: ``incarnation``) is named leader of ``rec`` but by an
    election of another process of it: then it must not lead (the controller elects again).
    A record without ``leader_incarnation`` (created by an older build) is not fenced."""
    inc = rec.get("leader_incarnation")
    return (rec.get("leader") == router and inc is not None and incarnation is not None
            and inc != incarnation)


async def register(socket_path: str, router: str, incarnation: str, kept_logs: bool,
                   timeout: float, damaged: list[str] | None = None) -> dict[str, Any] | None:
    """Propose the registration until Raft commits it (the record) or ``timeout`` passes
    (None: logged; the router runs, but the controller does not elect it until a later
    registration lands, see ``Registrar``). An unknown outcome is retried: the command is a
    compare-and-set, so a retry answers "already so"."""
    deadline = time.monotonic() + timeout
    why = "no answer"
    client = MetadataClient(socket_path)
    try:
        while time.monotonic() < deadline:
            left = deadline - time.monotonic()
            try:
                if not client.connected:
                    client = MetadataClient(socket_path)
                    await asyncio.wait_for(client.connect(), left)
                # one attempt waits at most ATTEMPT_TIMEOUT: Raft can lose a command without
                # answering (cluster/metaclient.py), and the command is a compare-and-set
                _applied, rec = await asyncio.wait_for(client.propose(
                    ["register_router", router, incarnation, _info(kept_logs, damaged)]),
                    min(left, ATTEMPT_TIMEOUT))
                if isinstance(rec, dict) and rec.get("incarnation") == incarnation:
                    log.info("router registered in Raft", extra={
                        "router": router, "incarnation": incarnation, "kept_logs": kept_logs})
                    return rec
                why = f"refused: {rec!r}"
            except MetadataUnavailable as err:
                why = str(err)
                if err.kind not in ("no_leader", "queue_full"):
                    client.close_now()
            except TimeoutError:
                why = "no Raft commit in time (no majority?)"
            except (OSError, ConnectionError) as err:
                why = f"metadata process not reachable ({err!r})"
                client.close_now()
            await asyncio.sleep(_RETRY)
    finally:
        client.close_now()
    log.error("router not registered in Raft within %.0f s (%s): the logs it led before are "
              "fenced, and it is not elected leader of any log until it registers; retrying",
              timeout, why, extra={"router": router})
    return None


async def wait_unfenced(records: Mapping[str, dict], router: str, incarnation: str,
                        timeout: float) -> list[str]:
    """Wait (at most ``timeout``) until no log record names ``router`` by an election of its
    previous process: the controller re-elects this process (its logs kept) or another
    replica. Called before the router's mesh links come up, so the APPENDs peers resend
    after the restart meet a router that leads again (at a new epoch, with ``leader_since``:
    cluster/placement.py accepts them) instead of one still fenced. Returns the devices still
    fenced (offline: their only in-sync replica was this router and its disk came back
    empty)."""
    deadline = time.monotonic() + timeout
    while True:
        left = [d for d, rec in records.items() if fenced(rec, router, incarnation)]
        if not left or time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.02)
    if left:
        log.error("%d device logs led by this router's previous process were not elected "
                  "again within %.1f s: they accept no writes here (offline if no other "
                  "in-sync replica is alive; see `meshmq cluster status`)", len(left), timeout,
                  extra={"router": router, "devices": left[:20]})
    return left


def _info(kept_logs: bool, damaged: list[str] | None) -> dict[str, Any]:
    """The registration's ``info``: ``damaged`` (the device logs whose recovery at this start
    quarantined a corrupt record) only when there are any, so a registration without is the
    same command an older router sends."""
    info: dict[str, Any] = {"kept_logs": kept_logs}
    if damaged:
        info["damaged"] = sorted(damaged)
    return info


class Registrar:
    """Registers at start and keeps trying in the background when the first try timed out
    (a node started without a Raft majority)."""

    def __init__(self, socket_path: str, router: str, incarnation: str, kept_logs: bool,
                 damaged: list[str] | None = None) -> None:
        self.args = (socket_path, router, incarnation, kept_logs)
        self.damaged = damaged
        self.registered = False
        self._task: asyncio.Task | None = None

    async def start(self, timeout: float) -> None:
        self.registered = await register(*self.args, timeout, self.damaged) is not None
        if not self.registered:
            self._task = asyncio.get_running_loop().create_task(self._retry())

    async def _retry(self) -> None:
        while not self.registered:
            self.registered = await register(*self.args, 30.0, self.damaged) is not None

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - closing anyway
                pass
