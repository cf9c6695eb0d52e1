"""Tools of the chaos runs: ``ip`` (Debian's iproute2) for the network namespaces, installed
here with apt when running as root (as CI does) and missing, one worker at a time
(``helpers/apt.py``). Without root the runs use the loopback + TCP proxy network and need
nothing (tests/chaos/net.py)."""

from __future__ import annotations

import shutil

import pytest
from helpers.apt import apt_install, can_install


@pytest.fixture(scope="session", autouse=True)
def chaos_tools() -> None:
    if not can_install() or shutil.which("ip") is not None:
        return
    res = apt_install("iproute2", lambda: shutil.which("ip") is not None)
    if res is not None and res.returncode != 0:
        pytest.fail(f"ip(8) is missing and installing iproute2 failed (exit {res.returncode}):"
                    f"\n{res.stderr[-2000:]}")
