"""An out-of-date build of the MQTT codec's optional C extension (``broker/protocol/_speedups``
compiled from an older ``_speedups.c``: a checkout updated without ``pip install -e .``, or a
``.so`` copied from another tree) is set aside like one that was never built: the node serves
clients on the pure-Python codec and says so, instead of dying at import. Before (issue 25's
``publish_packet``), ``codec.py`` read the new function at import time and every start raised
``AttributeError: module 'broker.protocol._speedups' has no attribute 'publish_packet'``."""

from __future__ import annotations

import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest
from helpers import raw as R
from helpers.broker import BrokerProc
from helpers.clients import unique

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("broker", "commitlog", "cluster", "meshmq")


def _stale_tree(dest: Path) -> Path:
    """A copy of the packages with the codec's extension rebuilt from today's source minus
    ``publish_packet`` (what a build from before issue 25 exports)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler: cannot build a stale extension")
    for pkg in PACKAGES:
        shutil.copytree(REPO / pkg, dest / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    src = (REPO / "broker/protocol/_speedups.c").read_text()
    old, n = re.subn(r'\{"publish_packet",[^}]*\},', "", src)
    assert n == 1, "the methods table's publish_packet entry moved: update this test"
    c_file = dest / "stale_speedups.c"
    c_file.write_text(old)
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    for so in (dest / "broker/protocol").glob("_speedups*"):
        so.unlink()
    subprocess.run([cc, "-shared", "-fPIC", "-O0", "-w", f"-I{sysconfig.get_paths()['include']}",
                    str(c_file), "-o", str(dest / f"broker/protocol/_speedups{suffix}")],
                   check=True, timeout=60)
    return dest


def test_a_stale_codec_extension_runs_the_pure_python_codec_and_says_so(tmp_path, raw):
    tree = _stale_tree(tmp_path / "tree")
    b = BrokerProc(tmp_path / "b", extra_env={"PYTHONPATH": str(tree),
                                               "BROKER_PURE_PYTHON": ""})
    try:
        b.start()
        topic = unique("stale") + "/t"
        sub = raw(b, version=5)
        sub.connect(unique("s"))
        sub.subscribe(topic, 0)
        pub = raw(b, version=4)
        pub.connect(unique("p"))
        pub.publish(topic, b"served")
        p = sub.expect(R.PUBLISH)
        assert (p.topic, p.payload) == (topic, b"served"), p
        assert "running the pure-Python codec" in b.log_text(), b.log_tail()
        assert b.metric("meshmq_compiled_fast_path", part="codec") == 0
    finally:
        b.stop()
        if b.proc is not None and b.proc.returncode not in (0, None):
            print(b.log_tail())
