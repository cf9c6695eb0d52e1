"""``deploy/Dockerfile`` builds the compiled fast paths (issue 27): its build stage installs
the headers the C extensions include, and, where a Docker daemon is reachable, the image
builds (its own fast-path check inside the build passes).

Without a daemon (as on the CI box today) the build test is skipped and says so; the header
check runs everywhere, in milliseconds.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from helpers.broker import REPO_ROOT

# System headers the extensions may include -> the Debian package that provides them
# (the C library's own come with libc6-dev).
_HEADER_PACKAGES = {"zlib.h": "zlib1g-dev", "lz4.h": "liblz4-dev", "zstd.h": "libzstd-dev",
                    "ssl.h": "libssl-dev"}
_LIBC = {"stdint.h", "string.h", "stddef.h", "stdlib.h", "limits.h", "stdio.h", "errno.h",
         "stdbool.h", "unistd.h", "Python.h",
         "structmember.h"}  # (Python's own headers, with Python.h in the python image)


def _build_stage() -> str:
    """The Dockerfile's first stage (from its FROM to the next one), comments left out (a
    comment naming a package installs nothing)."""
    text = (REPO_ROOT / "deploy" / "Dockerfile").read_text()
    stage = re.split(r"^FROM ", text, flags=re.M)[1]
    return "\n".join(ln for ln in stage.splitlines() if not ln.lstrip().startswith("#"))


def test_build_stage_installs_every_header_the_extensions_include() -> None:
    stage = _build_stage()
    for source in sorted(REPO_ROOT.glob("*/**/_speedups.c")) + sorted(
            REPO_ROOT.glob("*/_speedups.c")):
        for header in re.findall(r"#include <([^>]+)>", source.read_text()):
            name = header.rsplit("/", 1)[-1]
            if name in _LIBC:
                continue
            package = _HEADER_PACKAGES.get(name)
            assert package is not None, f"{source}: <{header}>: add its Debian package here"
            assert re.search(rf"\b{re.escape(package)}\b", stage), (
                f"{source.relative_to(REPO_ROOT)} includes <{header}> but the Dockerfile's "
                f"build stage does not install {package}: the wheel would fall back to pure "
                "Python and the image's fast-path check fail")


def _daemon() -> bool:
    if shutil.which("docker") is None:
        return False
    res = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"],
                         capture_output=True, text=True, timeout=30)
    return res.returncode == 0 and bool(res.stdout.strip())


@pytest.mark.timeout(1800)
def test_image_builds_with_its_fast_path_check() -> None:
    if not _daemon():
        pytest.skip("no Docker daemon reachable (docker version has no server): the image "
                    "build is not tried here; the header check above still runs")
    res = subprocess.run(["docker", "build", "-f", "deploy/Dockerfile", "-t",
                          "meshmq-test-build", "."], cwd=str(REPO_ROOT), capture_output=True,
                         text=True, timeout=1700)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
