"""One live process per data directory (meshmq/dirlock.py): a second ``meshmq serve`` on a
data_dir in use exits 2 naming the directory and the holder's PID, and starts nothing; a lock
file left by a kill -9'd process does not block the restart (the kernel releases an flock)."""

from __future__ import annotations

import json
import signal

import pytest
from helpers.broker import BrokerProc
from helpers.clusternode import ClusterNode

pytestmark = pytest.mark.timeout(90)


def test_second_serve_on_a_data_dir_in_use_exits_2_naming_it(tmp_path):
    first = BrokerProc(tmp_path / "first", ws=False).start()
    data_dir = first.workdir / "data"
    second = BrokerProc(tmp_path / "second", {"node": {"data_dir": str(data_dir)}}, ws=False)
    try:
        second.start(wait=False)
        assert second.proc is not None
        code = second.proc.wait(timeout=60)
        text = second.log_text()
        assert code == 2, text
        assert str(data_dir) in text and f"pid {first.pid}" in text, text
        assert "node.data_dir" in text, text
        assert "listening" not in text, text  # refused before any listener opened
        assert first.alive and first.http_get("/readyz")[0] == 200
    finally:
        second.kill()
        first.stop()


def test_lock_file_left_by_a_killed_node_does_not_block_a_restart(tmp_path):
    broker = BrokerProc(tmp_path / "b", ws=False).start()
    lock = broker.workdir / "data" / "meshmq.lock"
    try:
        old_pid = broker.pid
        assert json.loads(lock.read_text())["pid"] == old_pid
        broker.proc.send_signal(signal.SIGKILL)
        broker.proc.wait(10)
        assert lock.exists()  # the stale file is still there, naming a dead process
        broker.start()  # same data_dir: must come up
        assert json.loads(lock.read_text())["pid"] == broker.pid != old_pid
    finally:
        broker.stop()


def test_second_cluster_node_on_a_data_dir_in_use_exits_2_before_any_router(tmp_path):
    """The supervisor takes the node's lock itself: no router of the second node starts (a
    router would share the first node's MQTT port through SO_REUSEPORT)."""
    first = ClusterNode(tmp_path / "first", routers=1)
    second = ClusterNode(tmp_path / "second", routers=1,
                         overrides={"node": {"data_dir": str(tmp_path / "first" / "data")}})
    try:
        first.start()
        first.wait_routers_up()
        second.start(wait=False)
        assert second.proc is not None
        code = second.proc.wait(timeout=60)
        text = second.log_text()
        assert code == 2, text
        assert f"{tmp_path / 'first' / 'data'} is in use" in text, text
        assert f"pid {first.pid}" in text, text
        assert "router started" not in text, text
    finally:
        second.kill_everything()
        first.kill_everything()


def test_second_serve_on_a_commitlog_dir_in_use_exits_2_naming_the_key(tmp_path):
    """Other data_dirs, one commitlog.dir: the store's own lock refuses it, and that is an
    operator's fix (exit 2, the key named), not a failure systemd should restart into."""
    logs = tmp_path / "shared-log"
    first = BrokerProc(tmp_path / "first", {"commitlog": {"dir": str(logs)}}, ws=False).start()
    second = BrokerProc(tmp_path / "second", {"commitlog": {"dir": str(logs)}}, ws=False)
    try:
        second.start(wait=False)
        assert second.proc is not None
        code = second.proc.wait(timeout=60)
        text = second.log_text()
        assert code == 2, text
        assert "commitlog.dir" in text and str(logs) in text, text
        assert first.alive
    finally:
        second.kill()
        first.stop()
