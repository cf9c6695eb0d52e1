"""Install the Debian packages a test needs (as root, as CI is), one installer at a time.

The suite runs in several pytest-xdist worker processes (pyproject's addopts), and more than one
of them may reach a fixture that installs a tool (``mosquitto_bin``, ``fuse_tools``, the chaos
runs' ``ip``) at the same moment: two ``apt-get`` processes then race for dpkg's lock and the
loser fails ("Could not get lock /var/lib/dpkg/lock-frontend"). ``apt_install`` takes an
exclusive ``flock`` on one file in the temporary directory first, and re-checks whether the tool
appeared while it waited (the other worker installed it), so the packages are installed once.
``DPkg::Lock::Timeout`` makes apt itself wait for an apt run outside the suite instead of failing.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

LOCK_PATH = Path(tempfile.gettempdir()) / "meshmq-tests-apt.lock"
_APT = "apt-get -o DPkg::Lock::Timeout=300"


def can_install() -> bool:
    """Root with apt-get: the suite installs its own test tools (CI runs as root)."""
    return hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get") is not None


@contextlib.contextmanager
def apt_lock() -> Iterator[None]:
    """Held by one process of the test run at a time (every worker of every run on the box)."""
    with open(LOCK_PATH, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def apt_install(packages: str, present: Callable[[], bool], *,
                update_first: bool = False) -> subprocess.CompletedProcess[str] | None:
    """Install ``packages`` unless ``present()`` is true once the lock is held; None when there
    was nothing to do. ``update_first``: refresh the package lists before installing; otherwise
    only when the first install fails (a fresh box's lists may be missing or stale)."""
    with apt_lock():
        if present():
            return None
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        install = f"{_APT} install -y -qq {packages}"
        update = f"{_APT} update -qq"
        cmd = (f"{update} && {install}" if update_first
               else f"{install} || ({update} && {install})")
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, env=env,
                               timeout=600)
