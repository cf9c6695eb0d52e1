"""No router outlives its supervisor, whenever the supervisor dies (issue 28, defect 6).

``test_supervisor.py`` kills a supervisor whose routers are up, which ``PR_SET_PDEATHSIG``
covers. These cover what it does not: a supervisor that dies *before* its router asked the
kernel to be told, with a subreaper above it (systemd --user, tini -s, a container shim), where
the orphan's parent is not PID 1; and a node started again at once on the same config while an
orphaned router still holds its store (here: frozen with SIGSTOP, so the order is certain).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.broker import REPO_ROOT, wait_for
from helpers.clusternode import ClusterNode, mqtt_connect, pid_alive

pytestmark = pytest.mark.timeout(120)

# A subreaper that starts `sh`, which starts a router as the supervisor would (the same argv,
# --supervisor-pid naming the sh) and exits at once: the router's parent is dead before the
# router's Python has even started, and the orphan is reparented to this process, not PID 1.
# It reaps whatever it is given until the test kills it.
SUBREAPER = textwrap.dedent("""
    import ctypes, os, subprocess, sys, time
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    subprocess.Popen(["sh", "-c", '"$@" --supervisor-pid $$ & echo $! > "$PIDFILE"; exit 0',
                      "sh", *sys.argv[1:]])
    while True:
        try:
            os.wait()
        except ChildProcessError:
            time.sleep(0.1)
""")


def _env(pidfile: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESHMQ_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    env["PYTHONUNBUFFERED"] = "1"
    env["PIDFILE"] = str(pidfile)
    return env


@pytest.fixture
def reaped() -> Iterator[list[int]]:
    """PIDs to SIGKILL at teardown, whatever the test left running."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_router_whose_supervisor_died_before_it_started_exits(tmp_path, reaped):
    node = ClusterNode(tmp_path / "node", routers=1)  # its config file only: never started
    pidfile, log_path = tmp_path / "router.pid", tmp_path / "router.log"
    with open(log_path, "wb") as log:
        reaper = subprocess.Popen(
            [sys.executable, "-c", SUBREAPER, sys.executable, "-m", "meshmq", "serve", "-c",
             str(node.config_path), "--router", "0"],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=_env(pidfile))
    reaped.append(reaper.pid)
    try:
        router = wait_for(lambda: pidfile.exists() and pidfile.read_text().strip()
                          and int(pidfile.read_text()), timeout=30, message="the router's PID")
        reaped.insert(0, router)
        wait_for(lambda: not pid_alive(router), timeout=60,
                 message=f"orphaned router {router} exiting; its log:\n{log_path.read_text()}")
        assert "exited before this router started" in log_path.read_text()
    finally:
        reaper.kill()
        reaper.wait(10)


def test_node_restarted_while_an_orphan_holds_its_store_waits_for_it(tmp_path, reaped):
    old = ClusterNode(tmp_path / "node", routers=2)
    new: ClusterNode | None = None
    try:
        old.start()
        routers = old.wait_routers_up()
        reaped.extend(routers)
        for pid in routers:  # frozen: the death signal waits, the store locks stay held
            os.kill(pid, signal.SIGSTOP)
        os.kill(old.pid, signal.SIGKILL)
        old.proc.wait(10)
        config = old.config_path.read_text()
        new = ClusterNode(tmp_path / "node", routers=2)  # same workdir: same data_dir
        new.config_path.write_text(config)  # and the same ports: the same node again
        new.port, new.admin_port = old.port, old.admin_port
        offset = new.log_size()
        new.start(wait=False)
        wait_for(lambda: "waiting up to" in new.log_since(offset) or not new.alive,
                 timeout=60, message="the new node waiting for the old routers' stores")
        assert new.alive, new.log_since(offset)
        assert "router started" not in new.log_since(offset)  # none beside the orphans
        for pid in routers:
            os.kill(pid, signal.SIGCONT)  # the pending SIGTERM: the orphans drain and exit
        wait_for(lambda: not any(pid_alive(p) for p in routers), timeout=60,
                 message="the orphaned routers exiting")
        new.wait_ready(timeout=60)
        fresh = new.wait_routers_up()
        assert not set(fresh) & set(routers)
        mqtt_connect(new.port, "after-restart").close()
        assert "the supervisor (pid" in old.log_text()  # each orphan said why it went
    finally:
        for pid in reaped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        if new is not None:
            new.kill_everything()
        old.kill_everything()


def test_node_on_a_port_another_node_serves_exits_1_before_any_router(tmp_path):
    """Its routers would share the port with the first node's (SO_REUSEPORT, same user) and
    take a share of its clients; a single node fails on it with EADDRINUSE, so must this."""
    first = ClusterNode(tmp_path / "first", routers=1)
    second = ClusterNode(tmp_path / "second", routers=1, overrides={
        "listener": {"tcp": {"bind": f"127.0.0.1:{first.port}"}}})
    try:
        first.start()
        first.wait_routers_up()
        second.start(wait=False)
        assert second.proc is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            second.proc.wait(60)
        text = second.log_text()
        assert second.proc.returncode == 1, text
        assert f"listener.tcp.bind 127.0.0.1:{first.port}" in text, text
        assert "router started" not in text, text
        assert first.http_get("/readyz")[0] == 200
    finally:
        second.kill_everything()
        first.kill_everything()
