"""Chaos runs in CI (issue 23): a real 3-node cluster under a seeded fault schedule, checked
by ``tests/chaos/checker.py``. Each run is ``python -m tests.chaos`` in a subprocess (its
own threads and signal handlers; it removes what it created even when killed).

* ``test_short_schedule``: 20+ faults of every kind static placement must survive (all but
  ``wipe``: static placement loses a node's logs with its disk), about 2.5 minutes; soak only
  (``TEST_SOAK=1`` or ``-m slow``) since Raft placement is the cluster default.
* ``test_replicated_schedule``: CI's schedule, the same 20 faults on Raft placement with
  ``wipe`` and every kind of issue 24.
* ``test_probe``: a short run that the planted bugs of ``tests/mutations_chaos.py`` must
  fail (``tests/mutate.py chaos-``): disk-full faults (a remote owner refusing appends) and
  one-direction link cuts (entries lost in flight, resent after).

* ``test_raft_probe``: Raft placement (``--placement raft``, RF 3) under the fault kinds of
  issue 24 that today's tree can take (kill -9 of the node leading the most logs, its freeze
  past the lease, the Raft port cut, a follower's fetch cut, a disk fault), then the replica
  rules on every router's disk (``tests/chaos/replica_rules.py``), about 70 s.

When replication is in the tree (``tests/chaos/replicas.py`` detects it by its config key),
``test_replicated_schedule`` runs with ``--placement raft`` and adds node loss with its disk
(``wipe``) and every kind of issue 24. ``TEST_SOAK=1`` (or ``-m slow``) also runs the static
schedule and the long schedule (200 faults) the issue's closing note quotes.

As root (CI) the nodes run in network namespaces and the disk faults on tmpfs; otherwise on
loopback through TCP proxies, without disk faults (nor Raft port cuts).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.chaos.replicas import replication_missing

ROOT = Path(__file__).resolve().parents[2]
SUMMARY = re.compile(
    r"^chaos: seed=\d+ faults=(\d+) acked=(\d+) lost=(\d+) false_acks=(\d+) "
    r"dups_in_log=(\d+) order_violations=(\d+) missed_deliveries=(\d+) "
    r"max_unavailable_s=[\d.]+$", re.M)


def chaos(*args: str, timeout: float) -> tuple[int, str, re.Match[str]]:
    """Run ``python -m tests.chaos`` with ``args``; its run directory (history.json,
    check.json, node logs) is the default one under $TMPDIR/meshmq-chaos/, named in its first
    line, so a failed run can be read after pytest rotated its own temporary directories."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env = {k: v for k, v in env.items() if not k.startswith("MESHMQ_")}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.chaos", *args],
        cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    found = SUMMARY.findall(out)
    assert len(found) == 1, f"not exactly one summary line (exit {proc.returncode}):\n{out[-6000:]}"
    match = SUMMARY.search(out)
    assert match is not None
    return proc.returncode, out, match


TODAY_KINDS = "kill-router,kill-node,sigstop,partition,cut,disk,sigterm"
# with replication: node loss with its disk and every fault of issue 24 (tests/chaos/faults.py)
REPLICATED_KINDS = TODAY_KINDS + ",wipe,kill-leader,freeze-leader,diverge,raft-cut,fetch-cut"
REPLICA_LINE = re.compile(r"^chaos replicas: logs=(\d+) replica_violations=(\d+) "
                          r"epoch_violations=(\d+)", re.M)


# seed 3285 draws every one of the 13 kinds in 20 faults (3 wipes), with the shortest total
# fault time of the seeds below 5000 that do (seed 23 draws no wipe with these kinds)
REPLICATED_SEED = "3285"


def schedule_args() -> list[str]:
    """Today's kinds on static placement; with replication in the tree, Raft placement with
    ``wipe`` and the kinds of issue 24 (detected, so the lead switches nothing on)."""
    if replication_missing() is not None:
        return ["--seed", "23", "--kinds", TODAY_KINDS]
    return ["--seed", REPLICATED_SEED, "--kinds", REPLICATED_KINDS, "--placement", "raft"]


def soak(config: pytest.Config) -> bool:
    """TEST_SOAK=1 or ``-m slow`` (as tests/broker/test_devicelog_crash.py decides)."""
    markexpr = config.getoption("markexpr", "") or ""
    return os.environ.get("TEST_SOAK") == "1" or ("slow" in markexpr
                                                  and "not slow" not in markexpr)


@pytest.mark.slow
@pytest.mark.timeout(330)
def test_short_schedule(request: pytest.FixtureRequest) -> None:
    """20 faults, 3 nodes x 1 router, 30 devices, static placement: nothing acknowledged
    lost, no false ack, no duplicate or reordering in a log, no stored message missed by a
    subscriber owed it. Soak only (``TEST_SOAK=1`` or ``-m slow``, ~150 s): Raft placement
    is the cluster default, so CI's schedule is ``test_replicated_schedule`` (the same 20
    faults, every kind, node loss with its disk); static placement keeps ``test_probe`` (and
    the planted bugs of tests/mutations_chaos.py) in CI."""
    if not soak(request.config):
        pytest.skip("static-placement chaos schedule: TEST_SOAK=1 (about 2.5 minutes); CI "
                    "runs test_replicated_schedule, Raft placement being the default")
    rc, out, m = chaos("--faults", "20", "--seed", "23", "--kinds", TODAY_KINDS, timeout=300)
    assert int(m.group(1)) == 20 and int(m.group(2)) > 1000, out[-3000:]
    assert rc == 0, f"the chaos run found violations:\n{out[-6000:]}"


# This schedule (Raft placement, every kind, node loss with its disk on every node) found
# four defects on its way to passing (docs/replication.md, "Defects the chaos schedule found").
@pytest.mark.timeout(330)
def test_replicated_schedule() -> None:
    """The same 20 faults with Raft placement, RF 3 and every kind of issue 24 (node loss with
    its disk, kill of the leader of many logs, Raft port cut, follower fetch cut, a leader
    frozen past its lease, a diverged old leader), plus the replica rules."""
    args = schedule_args()
    rc, out, m = chaos("--faults", "20", *args, timeout=300)
    assert int(m.group(1)) == 20 and int(m.group(2)) > 1000, out[-3000:]
    # every kind ran, node loss with its disk included (as root: without it the disk and
    # Raft port faults are left out, which changes the seed's schedule)
    if "--placement" in args and "net: network namespaces" in out:
        ran = set(re.findall(r"\] fault \d+: (\S+) n\d", out))
        assert ran == set(REPLICATED_KINDS.split(",")), sorted(ran)
        assert REPLICA_LINE.search(out) is not None, out[-3000:]
    assert rc == 0, f"the chaos run found violations:\n{out[-6000:]}"


@pytest.mark.timeout(200)
def test_probe() -> None:
    """A short run today's cluster passes and each planted bug fails: two disk-full faults
    (a remote owner refusing appends: only its answer may ack them) and two one-direction
    link cuts (entries in flight are lost and must be resent); 12 devices at 5 msg/s. Without
    root there is no tmpfs: the disk faults are left out (the run's first line says so)."""
    rc, out, m = chaos("--kinds", "disk,cut", "--faults", "4", "--seed", "6",
                       "--min-fault-s", "3", "--max-fault-s", "5", "--devices", "12",
                       "--rate", "5", "--subscribers", "persistent,live,replay", timeout=180)
    assert int(m.group(1)) == 4, out[-3000:]
    assert rc == 0, f"the chaos probe found violations:\n{out[-6000:]}"


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_raft_probe(request: pytest.FixtureRequest) -> None:
    """Raft placement (RF 3) under the kinds of issue 24, 8 devices at 5 msg/s, the replica
    rules applied to every router's log after a clean stop. Soak only (``TEST_SOAK=1`` or
    ``-m slow``, ~40 s): every one of its kinds runs in CI's ``test_replicated_schedule``,
    with the replica rules, on a larger schedule; this one stays as a quick check of those
    kinds alone."""
    if not soak(request.config):
        pytest.skip("raft chaos probe: TEST_SOAK=1 (about 40 s); its kinds run in CI's "
                    "test_replicated_schedule")
    rc, out, m = chaos("--placement", "raft", "--kinds",
                       "kill-leader,freeze-leader,raft-cut,fetch-cut,disk", "--faults", "5",
                       "--seed", "11", "--min-fault-s", "2", "--max-fault-s", "3",
                       "--gap-s", "1.5", "--devices", "8", "--rate", "5", "--subscribers",
                       "persistent,live,replay", timeout=180)
    assert int(m.group(1)) == 5, out[-3000:]
    rep = REPLICA_LINE.search(out)
    assert rep is not None and int(rep.group(1)) >= 1, f"no replica check ran:\n{out[-3000:]}"
    assert rc == 0, f"the raft chaos probe found violations:\n{out[-6000:]}"


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_long_schedule(request: pytest.FixtureRequest) -> None:
    """The long run of issue 24's acceptance (>= 200 faults): ``TEST_SOAK=1`` or ``-m
    slow``; its summary line goes in the issue's closing note."""
    if not soak(request.config):
        pytest.skip("long chaos schedule: TEST_SOAK=1 (about 25 minutes)")
    args = [a if a not in ("23", REPLICATED_SEED) else "24" for a in schedule_args()]
    rc, out, m = chaos("--faults", "200", *args, timeout=3500)
    print(m.group(0))
    assert int(m.group(1)) == 200, out[-3000:]
    assert rc == 0, f"the long chaos run found violations:\n{out[-6000:]}"
