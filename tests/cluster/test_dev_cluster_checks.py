"""``meshmq dev-cluster`` refuses what would give half a cluster, and its nodes see the
``MESHMQ_*`` environment (issue 28, defects 8 and 10): every port checked before anything
starts (exit 2 naming it), readiness only from the node's own process, variables passed through
except the per-node keys it names."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.broker import REPO_ROOT, BrokerProc, wait_for
from helpers.cluster import free_port_range
from helpers.clusternode import mqtt_connect, pid_alive

from meshmq.devcluster import DevNode, wait_ready

pytestmark = pytest.mark.timeout(120)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESHMQ_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def _dev_cluster(tmp_path: Path, nodes: int, mqtt: int, admin: int, mesh: int,
                 out_name: str = "dev.out", **env: str) -> tuple[subprocess.Popen[bytes], Path]:
    out = tmp_path / out_name
    with open(out, "wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "meshmq", "dev-cluster", "--nodes", str(nodes),
             "--mqtt-port", str(mqtt), "--admin-port", str(admin), "--mesh-port", str(mesh),
             "--raft-port", str(free_port_range(nodes)),
             "--dir", str(tmp_path / "dev")],
            stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=_env(**env))
    return proc, out


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (dev-cluster stops its nodes by PID), SIGKILL if it hangs (its nodes then get
    SIGTERM from the kernel)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def test_port_of_a_running_broker_exits_2_naming_it_and_starts_nothing(tmp_path):
    """The issue's case: a `meshmq serve` already on node-0's MQTT and admin ports."""
    mqtt, admin, mesh = free_port_range(3), free_port_range(3), free_port_range(3)
    old = BrokerProc(tmp_path / "old", {"listener": {"tcp": {"bind": f"127.0.0.1:{mqtt}"}},
                                        "admin": {"bind": f"127.0.0.1:{admin}"}}, ws=False)
    old.port, old.admin_port = mqtt, admin
    old.start()
    proc, out = _dev_cluster(tmp_path, 3, mqtt, admin, mesh)
    try:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(60)
        text = out.read_text()
        assert proc.returncode == 2, text
        assert f"port {mqtt} (node-0 MQTT, --mqtt-port)" in text, text
        assert f"port {admin} (node-0 admin HTTP, --admin-port)" in text, text
        assert "nothing started" in text and "Ctrl-C stops every node" not in text, text
        assert not (tmp_path / "dev").exists()  # no config, no node, no log
        assert old.alive and old.http_get("/readyz")[0] == 200
    finally:
        _stop(proc)
        old.stop()


def test_taken_mesh_port_of_the_last_node_exits_2_naming_it(tmp_path):
    """A port held with SO_REUSEPORT (as a router holds its ports): the nodes' own binds would
    share it, so only the check before starting can see it."""
    mqtt, admin, mesh = free_port_range(2), free_port_range(2), free_port_range(2)
    holder = _reuseport_listener(mesh + 1)
    try:
        proc, out = _dev_cluster(tmp_path, 2, mqtt, admin, mesh)
        try:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(60)
            text = out.read_text()
            assert proc.returncode == 2, text
            assert f"port {mesh + 1} (node-1 router 0 mesh, --mesh-port)" in text, text
            assert not (tmp_path / "dev").exists()
        finally:
            _stop(proc)
    finally:
        holder.close()


def _reuseport_listener(port: int) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


def test_ready_answer_from_another_process_is_not_the_node(tmp_path):
    """Readiness is the node's own: a broker answering 200 on the node's admin port (taken
    after the port check) is not the node still starting."""
    impostor = BrokerProc(tmp_path / "impostor", ws=False).start()
    starting = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    node = DevNode(0, "node-0", impostor.port, impostor.admin_port, 0, tmp_path / "node-0",
                   proc=starting)
    err = io.StringIO()
    try:
        assert wait_ready([node], err, timeout=15) is True, "the impostor's /readyz accepted"
        assert f"127.0.0.1:{impostor.admin_port} answers /readyz" in err.getvalue()
        assert f"node-0 (pid {starting.pid})" in err.getvalue()
    finally:
        starting.kill()
        starting.wait(10)
        impostor.stop()


def test_meshmq_variables_reach_every_node_except_per_node_keys(tmp_path):
    mqtt, admin, mesh = free_port_range(2), free_port_range(2), free_port_range(2)
    proc, out = _dev_cluster(tmp_path, 2, mqtt, admin, mesh, MESHMQ_LOG__FORMAT="json",
                             MESHMQ_LISTENER__TCP__BIND="127.0.0.1:1")
    seen: set[int] = set()
    try:
        wait_for(lambda: "Ctrl-C stops every node" in out.read_text() or proc.poll() is not None,
                 timeout=90, message="dev-cluster's table")
        text = out.read_text()
        assert proc.poll() is None, text
        assert "passing to every node: MESHMQ_LOG__FORMAT" in text, text
        assert "ignoring MESHMQ_LISTENER__TCP__BIND (listener.tcp.bind)" in text, text
        for i in range(2):
            mqtt_connect(mqtt + i, f"env-{i}").close()  # each on its own port, not port 1
            lines = (tmp_path / "dev" / f"node-{i}" / "meshmq.log").read_text().splitlines()
            ready = [json.loads(ln) for ln in lines if "node ready" in ln]
            assert ready, lines[-5:]  # json.loads: the supervisor and its router log JSON
            seen.update(int(r["routers"][f"node-{i}/0"]) for r in ready if "routers" in r)
        _stop(proc)
        assert proc.returncode == 0
    finally:
        _stop(proc)
        for pid in seen:
            if pid_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def test_bad_meshmq_value_exits_2_before_any_node_starts(tmp_path):
    mqtt, admin, mesh = free_port_range(2), free_port_range(2), free_port_range(2)
    proc, out = _dev_cluster(tmp_path, 2, mqtt, admin, mesh, MESHMQ_MQTT__MAX_INFLIGHT="many")
    try:
        assert proc.wait(60) == 2, out.read_text()
        text = out.read_text()
        assert "mqtt.max_inflight" in text and "nothing started" in text, text
        assert not (tmp_path / "dev" / "node-0" / "meshmq.log").exists()
    finally:
        _stop(proc)


def test_second_dev_cluster_on_one_dir_exits_2_and_leaves_the_first_alone(tmp_path):
    """Other ports, same --dir: it would rewrite the running nodes' configs (a router restarted
    later reads them) and start nodes on their data."""
    first, out = _dev_cluster(tmp_path, 1, free_port_range(1), free_port_range(1),
                              free_port_range(1))
    second: subprocess.Popen[bytes] | None = None
    try:
        wait_for(lambda: "Ctrl-C stops every node" in out.read_text() or first.poll() is not None,
                 timeout=90, message="the first dev-cluster's table")
        assert first.poll() is None, out.read_text()
        config = tmp_path / "dev" / "node-0" / "meshmq.toml"
        before = config.read_text()
        second, out2 = _dev_cluster(tmp_path, 1, free_port_range(1), free_port_range(1),
                                    free_port_range(1), out_name="dev2.out")
        with contextlib.suppress(subprocess.TimeoutExpired):
            second.wait(60)
        text = out2.read_text()
        assert second.returncode == 2, text
        assert f"pid {first.pid}" in text and "nothing started" in text, text
        assert config.read_text() == before
        assert first.poll() is None
    finally:
        if second is not None:
            _stop(second)
        _stop(first)
