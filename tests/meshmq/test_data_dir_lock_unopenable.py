"""A data_dir lock file this process may not open is an operator's fix: exit 2 naming
node.data_dir and the file, not a traceback (review of issue 28, item 6).

The realistic case: ``meshmq serve`` run once by hand as root leaves ``meshmq.lock`` owned by
root, 0644; the service then runs as its own user and cannot open the file for writing
(EACCES). Before this ``DataDirLock.acquire`` let that OSError escape: a Python traceback and
exit 1, which systemd's ``Restart=on-failure`` restarts into forever, where every other
start-up check an operator must act on exits 2 naming its key (deploy/meshmq.service has
``RestartPreventExitStatus=2``). Tests run as root, whom permissions do not refuse, so the file
is made immutable (``chattr +i``: EPERM for root too); skipped where that is not possible.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from helpers.broker import BrokerProc

pytestmark = pytest.mark.timeout(90)


def test_lock_file_that_cannot_be_opened_exits_2_naming_it(tmp_path: Path):
    broker = BrokerProc(tmp_path / "b", ws=False)
    lock = broker.workdir / "data" / "meshmq.lock"
    lock.parent.mkdir(parents=True)
    lock.write_text("")
    res = subprocess.run(["chattr", "+i", str(lock)], capture_output=True, text=True,
                         check=False)
    if res.returncode != 0:
        pytest.skip(f"cannot make a file immutable here: {res.stderr.strip()}")
    try:
        broker.start(wait=False)
        assert broker.proc is not None
        code = broker.proc.wait(timeout=60)
        text = broker.log_text()
        assert code == 2, text
        assert "Traceback" not in text, text
        assert "node.data_dir" in text and str(lock) in text, text
    finally:
        subprocess.run(["chattr", "-i", str(lock)], check=False)
        broker.kill()
