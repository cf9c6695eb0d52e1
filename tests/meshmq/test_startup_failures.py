"""Start-up failures an operator must fix exit 2, name the config key and the cause, and nothing
listens first (meshmq/preflight.py). Exit 1 made systemd's Restart=on-failure loop on them, and
every OSError was blamed on "another broker already listening"."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from helpers.broker import BrokerProc
from helpers.certs import self_signed

pytestmark = pytest.mark.timeout(60)


def _fails(tmp_path, overrides, env=None) -> tuple[int, str]:
    b = BrokerProc(tmp_path / "b", overrides, ws=False, extra_env=env)
    b.start(wait=False)
    try:
        code = b.proc.wait(timeout=30)
    finally:
        if b.proc.poll() is None:
            b.kill()
    return code, b.log_text()


def _assert_nothing_listened(text: str) -> None:
    assert "listening" not in text, text
    assert "admin server listening" not in text, text


def test_data_dir_that_is_a_file(tmp_path):
    f = tmp_path / "not-a-dir"
    f.write_text("x")
    code, text = _fails(tmp_path, {"node": {"data_dir": str(f)}})
    assert code == 2, text
    assert "node.data_dir" in text and "not a directory" in text, text
    assert "already listening" not in text
    _assert_nothing_listened(text)


def test_data_dir_without_write_permission(tmp_path):
    """A read-only filesystem (also for root): tmpfs mounted ro; skipped where mount is not
    allowed."""
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a read-only tmpfs")
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    try:
        code, text = _fails(tmp_path, {"node": {"data_dir": str(ro / "data")}})
    finally:
        subprocess.run(["umount", str(ro)], capture_output=True)
    assert code == 2, text
    assert "node.data_dir" in text and "write permission" in text, text
    _assert_nothing_listened(text)


@pytest.fixture(scope="module")
def pems(tmp_path_factory):
    d = tmp_path_factory.mktemp("pems")
    return {name: self_signed(d, name) for name in ("a", "b")}


def _tls(crt: str, key: str) -> dict:
    return {"listener": {"tls": {"bind": "127.0.0.1:0", "certfile": crt, "keyfile": key}}}


def test_tls_key_that_does_not_match_the_certificate(tmp_path, pems):
    code, text = _fails(tmp_path, _tls(pems["a"][0], pems["b"][1]))
    assert code == 2, text
    assert "listener.tls.keyfile" in text and "not the private key" in text, text
    _assert_nothing_listened(text)


def test_certificate_given_as_the_key(tmp_path, pems):
    code, text = _fails(tmp_path, _tls(pems["a"][0], pems["a"][0]))
    assert code == 2, text
    assert "listener.tls.keyfile" in text and "PEM private key" in text, text
    _assert_nothing_listened(text)
