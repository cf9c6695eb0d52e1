"""``meshmq log list|tail|inspect``: the real CLI (subprocess) against a real AdminServer with the
fetch routes, run on its own event loop in a thread this test starts and stops."""

from __future__ import annotations

import asyncio
import io
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from commitlog.settings import LogSettings
from commitlog.store import LogStore
from meshmq.admin import AdminServer
from meshmq.cli import build_parser
from meshmq.fetch_api import register_fetch_routes
from meshmq.logcli import run_log
from meshmq.metrics import MetricsRegistry

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("MESHMQ_")}
    return subprocess.run([sys.executable, "-m", "meshmq", "log", *args], text=True,
                          capture_output=True, cwd=ROOT, env=base, timeout=timeout)


class NodeThread:
    """A LogStore + AdminServer(fetch routes) on an event loop in a thread. The store is only
    ever touched on that loop (its threading contract); ``call`` runs a function there."""

    def __init__(self, directory: str, settings: LogSettings | None = None) -> None:
        self.directory = directory
        self.settings = settings
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="admin-test",
                                       daemon=True)
        self.store: LogStore | None = None
        self.server: AdminServer | None = None

    def start(self) -> None:
        self.thread.start()
        self.run(self._start())

    async def _start(self) -> None:
        self.store = LogStore.open(self.directory, self.settings)
        self.server = AdminServer("127.0.0.1:0", MetricsRegistry(), lambda: True)
        register_fetch_routes(self.server.app, self.store)
        await self.server.start()

    async def _stop(self) -> None:
        assert self.server is not None and self.store is not None
        await self.server.stop()
        self.store.close()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def call(self, fn: Callable[[LogStore], Any]) -> Any:
        fut: Future[Any] = Future()

        def job() -> None:
            try:
                assert self.store is not None
                fut.set_result(fn(self.store))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                fut.set_exception(exc)

        self.loop.call_soon_threadsafe(job)
        return fut.result(timeout=30)

    @property
    def admin(self) -> str:
        assert self.server is not None
        return f"127.0.0.1:{self.server.port}"

    def stop(self) -> None:
        try:
            self.run(self._stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
            self.loop.close()


def append(store: LogStore, device: str, payloads: list[bytes], attrs: int = 1,
           ts0: int = 1_700_000_000_000_000) -> None:
    for i, p in enumerate(payloads):
        store.append(device, ts0 + i, f"devices/{device}/t", attrs, None, p)
    store.flush_sync_commit()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NodeThread]:
    n = NodeThread(str(tmp_path / "log"))
    n.start()
    try:
        yield n
    finally:
        n.stop()


def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------ inspect


def make_store(directory: Path) -> Path:
    store = LogStore.open(str(directory))
    append(store, "d1", [b"hello", b"world"])
    append(store, "d2", [b"x" * 100])
    store.close()
    return directory


def test_inspect_ok(tmp_path: Path):
    path = make_store(tmp_path / "log")
    result = cli("inspect", str(path))
    assert result.returncode == 0, result.stderr
    assert "RESULT: ok" in result.stdout
    assert "key 'd1': records=2 offsets 0..1" in result.stdout
    assert result.stderr == ""


def test_inspect_corrupt_byte(tmp_path: Path):
    path = make_store(tmp_path / "log")
    (seg,) = sorted(path.glob("*.log"))
    data = bytearray(seg.read_bytes())
    data[len(data) - 10] ^= 0xFF  # inside the payload of the last record: a CRC mismatch
    seg.write_bytes(bytes(data))
    result = cli("inspect", str(path))
    assert result.returncode == 1
    assert "CORRUPT" in result.stdout
    assert result.stderr.count("\n") == 1
    assert "is CORRUPT" in result.stderr and "CRC mismatch" in result.stderr


@pytest.mark.parametrize("what", ["missing", "empty", "file"])
def test_inspect_not_a_store(tmp_path: Path, what: str):
    target = tmp_path / "x"
    if what == "empty":
        target.mkdir()
    elif what == "file":
        target.write_text("x")
    result = cli("inspect", str(target))
    assert result.returncode == 1
    assert result.stderr.startswith("meshmq log inspect: ") and result.stderr.count("\n") == 1
    assert "<data_dir>/log" in result.stderr


# ------------------------------------------------------------------------------ list / tail


def test_list_and_tail(node: NodeThread):
    node.call(lambda s: append(s, "sensor-1", [b"21.5", b"\x00\xff", b"line\nbreak"]))
    node.call(lambda s: append(s, "a", [b"x"], attrs=2 | 4))

    result = cli("list", "--admin", node.admin)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["DEVICE", "LOG_START", "HIGH_WATERMARK"]
    assert [ln.split() for ln in lines[1:]] == [["a", "0", "1"], ["sensor-1", "0", "3"]]

    result = cli("list", "--admin", node.admin, "--format", "json")
    assert [json.loads(ln) for ln in result.stdout.splitlines()] == [
        {"device": "a", "log_start": 0, "high_watermark": 1, "start": 0, "end": 1},
        {"device": "sensor-1", "log_start": 0, "high_watermark": 3, "start": 0, "end": 3}]

    result = cli("tail", "sensor-1", "--admin", node.admin)
    assert result.returncode == 0, result.stderr
    rows = [ln.split("\t") for ln in result.stdout.splitlines()]
    assert rows == [
        ["0", "2023-11-14T22:13:20.000000Z", "devices/sensor-1/t", "qos=1", "retain=0", "21.5"],
        ["1", "2023-11-14T22:13:20.000001Z", "devices/sensor-1/t", "qos=1", "retain=0",
         "hex:00ff"],
        ["2", "2023-11-14T22:13:20.000002Z", "devices/sensor-1/t", "qos=1", "retain=0",
         "hex:" + b"line\nbreak".hex()],
    ]

    result = cli("tail", "a", "--admin", f"http://{node.admin}", "--format", "json")
    assert json.loads(result.stdout) == {
        "device": "a", "offset": 0, "timestamp_us": 1_700_000_000_000_000,
        "time": "2023-11-14T22:13:20.000000Z", "topic": "devices/a/t", "qos": 2, "retain": True,
        "payload": "x", "payload_encoding": "utf-8"}

    result = cli("tail", "sensor-1", "--from", "2", "--admin", node.admin)
    assert [ln.split("\t")[0] for ln in result.stdout.splitlines()] == ["2"]
    result = cli("tail", "sensor-1", "--from", "latest", "--admin", node.admin)
    assert (result.returncode, result.stdout) == (0, "")

    result = cli("tail", "nope", "--admin", node.admin)
    assert result.returncode == 1
    assert result.stderr == "meshmq log tail: unknown device 'nope'\n"
    result = cli("tail", "sensor-1", "--from", "9", "--admin", node.admin)
    assert result.returncode == 1 and "beyond the high-water mark (3)" in result.stderr
    result = cli("tail", "sensor-1", "--from", "soon", "--admin", node.admin)
    assert result.returncode == 1 and "--from 'soon'" in result.stderr


def test_unreachable_admin_is_one_clear_line():
    port = free_port()
    for args in (["list"], ["tail", "d1"], ["tail", "d1", "--follow"]):
        result = cli(*args, "--admin", f"127.0.0.1:{port}")
        assert result.returncode == 1, args
        assert result.stderr.count("\n") == 1
        assert f"cannot reach the admin API at http://127.0.0.1:{port}" in result.stderr
        assert "is `meshmq serve` running? set --admin" in result.stderr
    result = cli("list", "--admin", "nonsense")
    assert result.returncode == 1 and "--admin 'nonsense'" in result.stderr


def test_tail_follow_until_ctrl_c(node: NodeThread):
    node.call(lambda s: append(s, "d1", [b"one", b"two"]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESHMQ_")}
    # A test run started in the background by a non-interactive shell inherits SIGINT as
    # ignored, and Python then keeps it ignored: give the CLI the disposition a terminal has.
    proc = subprocess.Popen(
        [sys.executable, "-u", "-m", "meshmq", "log", "tail", "d1", "--follow", "--admin",
         node.admin], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stdout or ()],
                              daemon=True)
    reader.start()
    try:
        def payloads(n: int) -> list[str]:
            return [lines.get(timeout=20).rstrip("\n").split("\t")[-1] for _ in range(n)]

        assert payloads(2) == ["one", "two"]
        node.call(lambda s: append(s, "d1", [b"three"]))
        assert payloads(1) == ["three"]
        node.call(lambda s: append(s, "new-device", [b"elsewhere"]))
        node.call(lambda s: append(s, "d1", [b"four", b"five"]))
        assert payloads(2) == ["four", "five"]
        time.sleep(0.3)  # let it go back to polling at the end
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 130
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    assert proc.stderr is not None and "Traceback" not in proc.stderr.read()
    assert lines.empty()


def test_tail_skips_records_deleted_by_retention(tmp_path: Path):
    """In-process: offsets below the retained start are reported on stderr, then skipped."""
    settings = LogSettings(index_interval_bytes=64, segment_bytes=2048,
                           retention_bytes_per_device=1024, tail_cache_bytes_per_device=0)
    node = NodeThread(str(tmp_path / "log"), settings)
    node.start()
    try:
        for _ in range(5):
            node.call(lambda s: append(s, "d1", [b"p" * 60] * 10))
        node.call(lambda s: s.apply_retention(2**62))
        start, end = node.call(lambda s: s.log_range("d1"))
        assert start > 0
        args = build_parser().parse_args(["log", "tail", "d1", "--from", "0", "--admin",
                                          node.admin])
        out, err = io.StringIO(), io.StringIO()
        assert run_log(args, out, err) == 0
        assert [int(ln.split("\t")[0]) for ln in out.getvalue().splitlines()] == list(
            range(start, end))
        assert err.getvalue() == (f"meshmq log tail: offsets 0..{start - 1} of 'd1' were deleted "
                                  f"by retention; continuing at {start}\n")
    finally:
        node.stop()
