"""A full disk does not stop a node at its data_dir lock (review of issue 28, item 6).

The lock's file carries the holder's PID and command line for the error message only; the
lock itself is the kernel's flock. On a full filesystem creating an empty file still works
(an inode), writing that text does not (ENOSPC). Before this, ``DataDirLock.acquire`` let the
ENOSPC escape: ``meshmq serve`` died with a Python traceback and exit 1 (systemd restarts it
into the same traceback), where the release before the lock started, answered /readyz and let
the commit log refuse writes with its own clear errors. The text is now best effort: the lock
is held all the same (a second process is still refused with exit 2).

Needs a filesystem it can fill: a 1 MiB tmpfs, so root (skipped otherwise).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.broker import BrokerProc

pytestmark = pytest.mark.timeout(90)


@contextlib.contextmanager
def full_tmpfs(where: Path) -> Iterator[Path]:
    where.mkdir(parents=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs to fill needs root")
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)],
                         capture_output=True, text=True, check=False)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    try:
        (where / "data").mkdir()
        fd = os.open(where / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass  # ENOSPC: full
        finally:
            os.close(fd)
        yield where / "data"
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_node_on_a_full_disk_starts_and_still_holds_its_lock(tmp_path: Path):
    with full_tmpfs(tmp_path / "fs") as data_dir:
        first = BrokerProc(tmp_path / "first", {"node": {"data_dir": str(data_dir)}}, ws=False)
        second = BrokerProc(tmp_path / "second", {"node": {"data_dir": str(data_dir)}}, ws=False)
        try:
            first.start()  # raises with the log tail if it exits first
            assert "Traceback" not in first.log_text(), first.log_text()
            assert (data_dir / "meshmq.lock").exists()
            second.start(wait=False)
            assert second.proc is not None
            code = second.proc.wait(timeout=60)
            text = second.log_text()
            assert code == 2, text
            assert "node.data_dir" in text and str(data_dir) in text, text
            assert first.alive
        finally:
            second.kill()
            first.stop()
