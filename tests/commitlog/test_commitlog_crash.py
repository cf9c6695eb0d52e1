"""kill -9 a process that appends with group commit; every acknowledged record survives."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from commitlog.store import LogStore

ROOT = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent("""
    import asyncio, sys
    from commitlog import GroupCommitter, LogSettings, LogStore

    async def main(path):
        store = LogStore.open(path, LogSettings(segment_bytes=64 * 1024,
                                                index_interval_bytes=512))
        gc = GroupCommitter(store)
        out = sys.stdout
        keys = [f"dev{i}" for i in range(6)]
        n = 0
        while True:
            acked = []
            for _ in range(40):
                k = keys[n % len(keys)]
                off = gc.append(k, n, "t/" + k, 1, None, f"{k}:{n}".encode())
                acked.append(f"{k} {off} {n}")
                n += 1

            def done(exc, acked=acked):
                if exc is None:
                    out.write("\\n".join(acked) + "\\n")
                    out.flush()
            gc.when_durable(done)
            await asyncio.sleep(0)

    asyncio.run(main(sys.argv[1]))
""")


def test_kill9_loses_no_acknowledged_record(tmp_path):
    store_dir = tmp_path / "store"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    rng = random.Random(1234)
    acked: dict[str, list[tuple[int, int]]] = {}
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for _round in range(4):
        proc = subprocess.Popen([sys.executable, str(script), str(store_dir)],
                                stdout=subprocess.PIPE, env=env, cwd=str(ROOT))
        # wait until it acknowledges something, then kill at a random moment
        first = proc.stdout.readline()
        assert first, "child produced no acknowledgement"
        time.sleep(rng.uniform(0.05, 0.4))
        os.kill(proc.pid, signal.SIGKILL)
        rest = proc.stdout.read()
        proc.wait()
        for line in (first + rest).decode().splitlines():
            if not line.strip():
                continue
            k, off, n = line.split()
            acked.setdefault(k, []).append((int(off), int(n)))
        with LogStore.open(str(store_dir)) as st:
            for k, pairs in acked.items():
                offs = [o for o, _ in pairs]
                assert offs == sorted(offs) and len(set(offs)) == len(offs)
                recs = list(st.iter_records(k))
                # dense, once each, in order; every acknowledged one present with its payload
                assert [r.offset for r in recs] == list(range(len(recs)))
                by_off = {r.offset: r for r in recs}
                for off, n in pairs:
                    assert by_off[off].payload == f"{k}:{n}".encode()
    assert sum(len(v) for v in acked.values()) > 1000
