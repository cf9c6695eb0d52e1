"""A real small volume for the full-disk tests: a tmpfs mounted under the test's directory
(root only: a test skips with the reason otherwise, and CI runs as root), and a filler that
takes every byte left on it. One copy for every test that fills a disk, so their volumes
behave the same (it was repeated in five test files)."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def tmpfs_volume(tmp_path: Path, size: str = "2m") -> Iterator[Path]:
    """Yield a tmpfs of ``size`` mounted at ``tmp_path / "vol"``; unmounted afterwards (lazily:
    a broker still holding a file on it must not fail the teardown)."""
    if os.geteuid() != 0:
        pytest.skip(f"needs root to mount a {size} tmpfs (the full-disk tests run as root in CI)")
    vol = tmp_path / "vol"
    vol.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(vol)],
                         capture_output=True, text=True, check=False)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip() or res.returncode}")
    try:
        yield vol
    finally:
        subprocess.run(["umount", "-l", str(vol)], check=False)


def fill_rest(path: Path) -> None:
    """Take every byte left on the volume holding ``path`` (so even a broker's probe write
    cannot succeed)."""
    with open(path, "ab", buffering=0) as f:
        chunk = b"\0" * 4096
        while True:
            try:
                f.write(chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                return
