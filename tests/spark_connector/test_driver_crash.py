"""kill -9 of the Spark driver (its Python process, JVM and workers) in the middle of a
micro-batch, then a restart from the checkpoint: no record lost, none duplicated in the
committed Parquet output (the file sink's metadata log decides what is committed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers.broker import wait_for
from helpers.spark import admin, device_messages, publish, spark_env, unique_device

JOB = Path(__file__).resolve().parent / "driver_job.py"
HANG = 240.0


def _batch_ids(directory: Path) -> set[int]:
    if not directory.is_dir():
        return set()
    return {int(p.name) for p in directory.iterdir() if p.name.isdigit()}


def _start_job(args: list[str], tmp: Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as f:
        return subprocess.Popen([sys.executable, str(JOB), *args], stdout=f, stderr=f,
                                stdin=subprocess.DEVNULL, env=spark_env(tmp),
                                start_new_session=True)


@pytest.mark.timeout(900)  # two driver runs of up to HANG each, on a loaded 2-core box
def test_kill_driver_mid_batch_and_restart(spark: Any, shared_broker: Any,
                                           tmp_path: Path) -> None:
    devs = [unique_device("k") for _ in range(4)]
    publish(shared_broker, [m for d in devs for m in device_messages(d, 0, 500)])
    ck, out, scratch, log = (tmp_path / "ck", tmp_path / "out", tmp_path / "scratch",
                             tmp_path / "driver.log")
    scratch.mkdir()
    args = [admin(shared_broker), "|".join(devs), str(ck), str(out), "400", str(scratch)]
    # Mid-batch: batch N is planned (offsets/N written) but not committed (no commits/N),
    # after at least two committed batches; polled far faster than a batch runs. The kill can
    # still land just after the commit (batches take ~1 s here): then the run continues from
    # the checkpoint and is killed again in a later batch, up to three tries.
    for _attempt in range(3):
        job = _start_job(args, scratch, log)
        try:
            def mid_batch(job: subprocess.Popen[bytes] = job) -> bool:
                if job.poll() is not None:
                    if job.returncode == 0:
                        return True  # it finished everything: no batch left to kill in
                    raise AssertionError(f"driver exited early ({job.returncode}):\n"
                                         + log.read_text()[-3000:])
                done = _batch_ids(ck / "commits")
                return len(done) >= 2 and max(_batch_ids(ck / "offsets"), default=-1) > max(
                    done)

            wait_for(mid_batch, HANG, interval=0.01, message="a micro-batch in flight")
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait(30)
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait(30)
        planned, committed = _batch_ids(ck / "offsets"), _batch_ids(ck / "commits")
        if max(planned) > max(committed):
            break
    assert max(planned) > max(committed), "the kill did not land inside a batch (3 tries)"
    job = _start_job(args, scratch, log)
    try:
        assert job.wait(HANG) == 0, log.read_text()[-5000:]
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(30)
    rows = spark.read.parquet(str(out)).select("device", "offset", "payload").collect()
    seen: dict[str, list[int]] = {}
    for r in rows:
        assert r["payload"] == f"{r['device']}:{r['offset']}".encode()
        seen.setdefault(r["device"], []).append(r["offset"])
    assert sorted(seen) == sorted(devs)
    for d in devs:
        assert sorted(seen[d]) == list(range(500)), (
            f"{d}: {len(seen[d])} rows, {len(set(seen[d]))} distinct")
