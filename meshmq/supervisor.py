"""The process side of a cluster node: start N router processes, restart one that dies, pass
signals on, and stop every child by its PID.

Why processes and not threads: a router is an event loop that must stay near 2 ms of lag, and
CPython runs one thread of Python at a time; N processes sharing the MQTT ports with
SO_REUSEPORT are how meshmq uses N cores (see docs/architecture.md,
"Processes"). Why one supervisor in front of them: an operator (systemd, Kubernetes, a shell)
manages one process per node, with one PID to signal and one exit code, as with Mosquitto and
EMQX; the routers are an implementation detail behind it.

What this module decides, and why:

* **Readiness is an announcement.** A router writes a small JSON file (``announce_file(r)``:
  its PID and its admin port) once it is serving; the supervisor deletes the file before each
  start and accepts only one that names the child it started, so a stale file from a previous
  run or a previous child never counts. No pipe has to survive ``exec``, and the file is there
  for an operator to read.
* **A start failure is not retried; a crash is.** A router that exits before it ever announced
  (port taken, store locked, bad config) would fail the same way again: the supervisor stops
  the others and exits with the child's code (2 stays 2, a configuration error systemd must not
  restart on; anything else becomes 1). A router that had been serving and dies is restarted
  with exponential backoff (``backoff_min`` doubling to ``backoff_max``, back to the minimum
  once a child has run ``stable_after`` seconds), forever, each death logged with its cause:
  Kubernetes' CrashLoopBackOff and systemd's ``Restart=`` do the same.
* **Children get their own session** (``start_new_session``): Ctrl-C in a terminal signals the
  whole foreground group, and a router that drained on its own SIGINT would race the
  supervisor's decision to restart it. Only the supervisor's signals reach them: SIGTERM and
  SIGINT become SIGTERM to every router (each drains, then the supervisor exits 0), SIGHUP is
  forwarded as SIGHUP (each router reloads its files). A router also asks the kernel for SIGTERM
  if the supervisor dies (``PR_SET_PDEATHSIG``, set by the router itself) and then checks that
  its parent is still the supervisor's PID it was given (a death before the prctl), so a kill
  -9'd supervisor leaves no orphan holding the ports (meshmq/router_proc.py).
* **Stop is by PID**, SIGTERM then SIGKILL after ``stop_timeout``: never by name, never a
  process group the supervisor did not create.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Supervisor", "RouterChild", "describe_exit"]

log = logging.getLogger("meshmq.supervisor")

ANNOUNCE_POLL_S = 0.05


def describe_exit(returncode: int) -> str:
    """``"exit code 1"`` or ``"killed by SIGKILL"``: what an operator needs in the log line."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


@dataclass
class RouterChild:
    """One router process slot: the current process (if any) and its history."""

    index: int
    router_id: str
    proc: asyncio.subprocess.Process | None = None
    pid: int | None = None
    state: str = "starting"  # starting | up | restarting | stopped
    started_at: float = 0.0  # wall clock of the current process's start
    up_since: float | None = None  # wall clock of its announcement
    restarts: int = 0
    last_exit: str | None = None
    announced: dict[str, Any] = field(default_factory=dict)
    _monotonic_start: float = 0.0
    _failures: int = 0  # consecutive short-lived runs: the backoff exponent

    def status(self) -> dict[str, Any]:
        """JSON-able view for the admin API and ``meshmq cluster status``."""
        return {"index": self.index, "router": self.router_id, "pid": self.pid,
                "state": self.state, "started_at": self.started_at, "up_since": self.up_since,
                "restarts": self.restarts, "last_exit": self.last_exit}


class Supervisor:
    """Runs ``count`` router processes; ``argv(r)`` is router r's command line.

    ``announce_file(r)`` is where router r announces itself (see the module docstring);
    ``router_ids[r]`` names it in logs. ``env`` and ``cwd`` are the children's (default: ours).
    """

    def __init__(self, count: int, argv: Callable[[int], Sequence[str]],
                 announce_file: Callable[[int], Path], router_ids: Sequence[str], *,
                 env: Mapping[str, str] | None = None, cwd: str | None = None,
                 backoff_min: float = 0.5, backoff_max: float = 30.0,
                 stable_after: float = 60.0, stop_timeout: float = 25.0) -> None:
        if count < 1 or len(router_ids) != count:
            raise ValueError("one router id per router, at least one router")
        self._argv = argv
        self._announce_file = announce_file
        self._env = dict(env) if env is not None else None
        self._cwd = cwd
        self.backoff_min, self.backoff_max = backoff_min, backoff_max
        self.stable_after = stable_after
        self.stop_timeout = stop_timeout
        self.children = [RouterChild(r, router_ids[r]) for r in range(count)]
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._done: asyncio.Future[int] | None = None
        self._all_up = asyncio.Event()

    # -- public ---------------------------------------------------------------------------------
    async def start(self) -> None:
        """Spawn every router; returns at once (``wait_up()`` waits for their announcements)."""
        self._done = asyncio.get_running_loop().create_future()
        if self._stopping:  # SIGTERM arrived before the routers were spawned: spawn none
            self._done.set_result(0)
            return
        for child in self.children:
            self._tasks.append(asyncio.create_task(self._watch(child),
                                                   name=f"supervise {child.router_id}"))

    async def wait_up(self, timeout: float | None = None) -> bool:
        """True once every router has announced itself at least once (False on timeout or when
        the supervisor gave up first)."""
        assert self._done is not None, "start() first"
        up = asyncio.ensure_future(self._all_up.wait())
        try:
            await asyncio.wait({up, self._done}, timeout=timeout,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            up.cancel()
        return self._all_up.is_set() and not self._done.done()

    async def wait(self) -> int:
        """Until the supervisor gives up on a router (its exit code) or ``stop()`` finished (0)."""
        assert self._done is not None, "start() first"
        return await asyncio.shield(self._done)

    def forward(self, sig: int) -> list[int]:
        """Send ``sig`` to every live router by PID; returns the PIDs signalled."""
        sent = []
        for child in self.children:
            if child.proc is not None and child.proc.returncode is None and child.pid:
                try:
                    os.kill(child.pid, sig)
                    sent.append(child.pid)
                except ProcessLookupError:
                    pass
        return sent

    async def stop(self, code: int = 0) -> int:
        """SIGTERM every router, wait up to ``stop_timeout`` for the drains, SIGKILL the rest.

        Idempotent; returns the supervisor's exit code (``code`` unless a give-up set one)."""
        self._stopping = True
        pids = self.forward(signal.SIGTERM)
        if pids:
            log.info("stopping routers", extra={"pids": pids})
        procs = [c.proc for c in self.children if c.proc is not None]
        waits = [asyncio.ensure_future(p.wait()) for p in procs]
        if waits:
            _, pending = await asyncio.wait(waits, timeout=self.stop_timeout)
            if pending:
                late = [c for c in self.children
                        if c.proc is not None and c.proc.returncode is None]
                log.error("routers did not drain within %.0fs, killing them", self.stop_timeout,
                          extra={"pids": [c.pid for c in late]})
                for child in late:
                    try:
                        os.kill(child.pid or 0, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                await asyncio.wait(pending, timeout=5)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.forward(signal.SIGKILL)  # anything spawned while we stopped: no orphans
        for child in self.children:
            child.state = "stopped"
        if self._done is not None and not self._done.done():
            self._done.set_result(code)
        return self._done.result() if self._done is not None else code

    def admin_port(self, index: int) -> int | None:
        """Router ``index``'s loopback admin port, once it announced itself (else None)."""
        child = self.children[index]
        port = child.announced.get("admin_port") if child.state == "up" else None
        return int(port) if isinstance(port, int) else None

    # -- one slot -------------------------------------------------------------------------------
    async def _spawn(self, child: RouterChild) -> None:
        path = self._announce_file(child.index)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        child.announced = {}
        child.proc = await asyncio.create_subprocess_exec(
            *self._argv(child.index), env=self._env, cwd=self._cwd,
            stdin=asyncio.subprocess.DEVNULL, start_new_session=True)
        child.pid = child.proc.pid
        child.state = "starting"
        child.started_at = time.time()
        child.up_since = None
        child._monotonic_start = time.monotonic()
        log.info("router started", extra={"router": child.router_id, "pid": child.pid})

    async def _await_announcement(self, child: RouterChild) -> bool:
        """Poll the announce file until it names this child's PID; False if the child exits."""
        assert child.proc is not None
        path = self._announce_file(child.index)
        while child.proc.returncode is None:
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                data = None
            if isinstance(data, dict) and data.get("pid") == child.pid:
                child.announced = data
                child.state = "up"
                child.up_since = time.time()
                log.info("router up", extra={"router": child.router_id, "pid": child.pid,
                                             "admin_port": data.get("admin_port")})
                if all(c.state == "up" for c in self.children):
                    self._all_up.set()
                return True
            try:
                await asyncio.wait_for(asyncio.shield(child.proc.wait()), ANNOUNCE_POLL_S)
            except TimeoutError:
                pass
        return False

    async def _watch(self, child: RouterChild) -> None:
        ever_up = False
        while not self._stopping:
            try:
                await self._spawn(child)
            except OSError as exc:
                log.error("cannot start router %s: %s", child.router_id, exc)
                self._give_up(1)
                return
            assert child.proc is not None
            if self._stopping:  # stop() ran while this one was being spawned: it missed it
                self.forward(signal.SIGTERM)
            if await self._await_announcement(child):
                ever_up = True
            code = await child.proc.wait()
            child.last_exit = describe_exit(code)
            if self._stopping:
                log.info("router stopped", extra={"router": child.router_id, "pid": child.pid,
                                                  "exit": child.last_exit})
                return
            ran = time.monotonic() - child._monotonic_start
            if not ever_up or code == 2:
                # A start that fails fails again, and exit 2 means configuration: an operator's
                # job. Stop the node with the child's verdict rather than loop.
                why = "before it was ready" if not ever_up else "with a configuration error"
                log.error("router %s (pid %s) exited %s (%s): stopping the node",
                          child.router_id, child.pid, why, child.last_exit,
                          extra={"router": child.router_id, "pid": child.pid})
                child.state = "stopped"
                self._give_up(2 if code == 2 else 1)
                return
            child._failures = 0 if ran >= self.stable_after else child._failures + 1
            delay = min(self.backoff_max, self.backoff_min * 2 ** max(0, child._failures - 1))
            child.restarts += 1
            child.state = "restarting"
            log.error("router %s (pid %s) died (%s) after %.1fs; restarting in %.1fs "
                      "(restart #%d)", child.router_id, child.pid, child.last_exit, ran, delay,
                      child.restarts, extra={"router": child.router_id, "pid": child.pid,
                                             "exit": child.last_exit})
            await asyncio.sleep(delay)

    def _give_up(self, code: int) -> None:
        if not self._stopping:
            asyncio.get_running_loop().create_task(self.stop(code))
