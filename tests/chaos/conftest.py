"""Tools of the chaos runs: ``ip`` (Debian's iproute2) for the network namespaces, installed
here with apt when running as root (as CI does) and missing. Without root the runs use the
loopback + TCP proxy network and need nothing (tests/chaos/net.py)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


@pytest.fixture(scope="session", autouse=True)
def chaos_tools() -> None:
    if os.geteuid() != 0 or shutil.which("ip") is not None or shutil.which("apt-get") is None:
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    res = subprocess.run("apt-get install -y -qq iproute2 || (apt-get update -qq && "
                         "apt-get install -y -qq iproute2)", shell=True, capture_output=True,
                         text=True, env=env, timeout=600)
    if res.returncode != 0:
        pytest.fail(f"ip(8) is missing and installing iproute2 failed (exit {res.returncode}):"
                    f"\n{res.stderr[-2000:]}")
