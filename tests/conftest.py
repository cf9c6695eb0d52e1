"""Shared fixtures for the broker behaviour tests (tests/broker, tests/interop).

* ``start_broker(tmp_path=None, **overrides)`` - a function-scoped factory of real broker processes
  (``python -m meshmq serve -c CONFIG``); every one is stopped by its PID at the end of the test.
* ``module_broker_factory`` - the same, module-scoped, for modules that share one broker.
* ``broker`` - a module-scoped broker with the default settings.
* ``clients`` - paho clients (v3.1/3.1.1/5) disconnected at the end of the test.
* ``raw`` - raw-socket clients (tests/helpers/raw.py) closed at the end of the test.
* ``mosquitto_bin`` - makes sure mosquitto_pub/mosquitto_sub exist (installs them when root).
* ``mosquitto_passwd_bin`` - the same for mosquitto_passwd (Debian's ``mosquitto`` package).
* ``fuse_tools`` - FUSE for the power-loss tests (installs fuse3 when root).

With ``CI=true`` a test skipped because a compiled extension or a test tool is missing fails
instead, saying what to install (``_CI_REQUIRED``).

When a test fails, the tail of every involved broker's stderr is attached to the report.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# Load tests/helpers as the top-level package "helpers" by file location, without putting tests/
# on sys.path (that would let tests/broker and tests/meshmq shadow the real packages).
if "helpers" not in sys.modules:
    _helpers_dir = Path(__file__).resolve().parent / "helpers"
    _spec = importlib.util.spec_from_file_location(
        "helpers", _helpers_dir / "__init__.py", submodule_search_locations=[str(_helpers_dir)]
    )
    assert _spec is not None and _spec.loader is not None
    _module = importlib.util.module_from_spec(_spec)
    sys.modules["helpers"] = _module
    _spec.loader.exec_module(_module)

from helpers.apt import apt_install, can_install  # noqa: E402
from helpers.broker import ALL_BROKERS, BrokerProc  # noqa: E402
from helpers.clients import ClientFactory  # noqa: E402
from helpers.raw import RawClient  # noqa: E402

_item_start_index: dict[str, int] = {}


def _factory(base_dir_fn: Callable[[], Path]) -> tuple[Callable[..., BrokerProc], list[BrokerProc]]:
    started: list[BrokerProc] = []
    counter = [0]

    def start(tmp_path: Path | None = None, *, ws: bool = True,
              tls: tuple[str, str] | None = None, env: dict[str, str] | None = None,
              wait: bool = True, **overrides: Any) -> BrokerProc:
        counter[0] += 1
        workdir = Path(tmp_path) if tmp_path is not None else base_dir_fn()
        workdir = workdir / f"broker{counter[0]}"
        proc = BrokerProc(workdir, overrides, ws=ws, tls=tls, extra_env=env)
        started.append(proc)
        proc.start(wait=wait)
        return proc

    return start, started


def _stop_all(started: list[BrokerProc]) -> None:
    for proc in started:
        try:
            proc.stop(timeout=10)
        except Exception:  # noqa: BLE001 - finalizer must reach every process
            proc.kill()


@pytest.fixture
def start_broker(tmp_path: Path) -> Iterator[Callable[..., BrokerProc]]:
    """Factory: ``start_broker(tmp_path=None, ws=True, tls=None, env=None, mqtt={...},
    auth={...}, log={...})`` -> a ready BrokerProc (stopped by PID at teardown)."""
    start, started = _factory(lambda: tmp_path)
    yield start
    _stop_all(started)


@pytest.fixture(scope="module")
def module_broker_factory(tmp_path_factory: pytest.TempPathFactory
                          ) -> Iterator[Callable[..., BrokerProc]]:
    start, started = _factory(lambda: tmp_path_factory.mktemp("modbroker"))
    yield start
    _stop_all(started)


@pytest.fixture(scope="module")
def broker(module_broker_factory: Callable[..., BrokerProc]) -> BrokerProc:
    """A broker with the default settings, shared by one test module."""
    return module_broker_factory()


@pytest.fixture
def clients() -> Iterator[ClientFactory]:
    factory = ClientFactory()
    yield factory
    factory.close_all()


@pytest.fixture
def raw() -> Iterator[Callable[..., RawClient]]:
    """Factory: ``raw(broker, version=4, rcvbuf=None, port=None)`` -> a connected socket."""
    made: list[RawClient] = []

    def make(broker: BrokerProc, version: int = 4, *, port: int | None = None,
             **kwargs: Any) -> RawClient:
        client = RawClient(broker.host, port or broker.port, version=version, **kwargs)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


@pytest.fixture(scope="session")
def mosquitto_bin() -> dict[str, str]:
    """Paths of mosquitto_pub and mosquitto_sub; installs mosquitto-clients when root."""

    def present() -> bool:
        return all(shutil.which(tool) is not None for tool in ("mosquitto_pub", "mosquitto_sub"))

    if not present():
        if can_install():
            res = apt_install("mosquitto-clients", present, update_first=True)
            if res is not None and res.returncode != 0:
                pytest.fail(
                    "mosquitto_pub/mosquitto_sub are missing and installing mosquitto-clients "
                    f"failed (exit {res.returncode}):\n{res.stderr[-2000:]}"
                )
        else:
            pytest.fail(
                "mosquitto_pub/mosquitto_sub are missing. Install them with "
                "`sudo apt-get install -y mosquitto-clients` (Debian/Ubuntu), "
                "`brew install mosquitto` (macOS) or `dnf install mosquitto`."
            )
    pub, sub = shutil.which("mosquitto_pub"), shutil.which("mosquitto_sub")
    if pub is None or sub is None:
        pytest.fail("mosquitto-clients installed but mosquitto_pub/mosquitto_sub not on PATH")
    return {"pub": pub, "sub": sub}


def _apt_install(packages: str, what: str, present: Callable[[], bool]) -> None:
    """Install Debian packages when root (as CI is), else fail saying what to install; one
    worker at a time (helpers/apt.py), re-checking ``present()`` once it is its turn."""
    if can_install():
        res = apt_install(packages, present)
        if res is not None and res.returncode != 0:
            pytest.fail(f"{what} is missing and installing {packages} failed "
                        f"(exit {res.returncode}):\n{res.stderr[-2000:]}")
        return
    pytest.fail(f"{what} is missing. Install it with `sudo apt-get install -y {packages}`.")


@pytest.fixture(scope="session")
def fuse_tools() -> None:
    """FUSE for the power-loss tests (tests/helpers/lazyfs.py): /dev/fuse, fusermount3 and
    libfuse3 (Debian's fuse3, installed here when root) and mfusepy (the test extra).

    A machine without /dev/fuse (a container started without it) cannot run them at all: that
    skips outside CI and fails in CI, where the power-loss test is the proof of the ack promise.
    """
    from helpers.lazyfs import FUSERMOUNT, fuse_problem

    problem = fuse_problem()
    if problem is not None and os.path.exists("/dev/fuse") and shutil.which(FUSERMOUNT) is None:
        _apt_install("fuse3", f"{FUSERMOUNT} (Debian's fuse3)",
                     lambda: shutil.which(FUSERMOUNT) is not None)
        problem = fuse_problem()
    if problem is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"power-loss tests cannot run: {problem}")
        pytest.skip(f"power-loss tests need FUSE: {problem}")


@pytest.fixture(scope="session")
def mosquitto_passwd_bin() -> str:
    """Path of mosquitto_passwd (Debian's ``mosquitto`` package, not ``mosquitto-clients``);
    installs it when root, as CI is."""
    if shutil.which("mosquitto_passwd") is None:
        _apt_install("mosquitto", "mosquitto_passwd (Debian's mosquitto package)",
                     lambda: shutil.which("mosquitto_passwd") is not None)
    path = shutil.which("mosquitto_passwd")
    if path is None:
        pytest.fail("mosquitto installed but mosquitto_passwd is not on PATH")
    return path


# --------------------------------------------------------------------------------------------
# No silent skips in CI
# --------------------------------------------------------------------------------------------

# A skip whose reason matches one of these means a part of the suite did not run because
# something is missing from the machine. On a developer's laptop that is a fair skip; in CI
# (CI=true) it would let a whole code path (the C fast paths, the power-loss proof) go
# untested while the run looks green, so it becomes a failure that says what to install.
_CI_REQUIRED: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"_speedups.* not built"),
     "the optional C extensions were not compiled: install a C compiler and the Python "
     "headers (Debian: apt-get install -y build-essential python3-dev) and run "
     "`pip install -e '.[test]'` again (it builds them in place)"),
    (re.compile(r"mosquitto_passwd"),
     "mosquitto_passwd is missing: apt-get install -y mosquitto (not mosquitto-clients)"),
    (re.compile(r"need FUSE|fusermount3|mfusepy|/dev/fuse"),
     "FUSE is missing: apt-get install -y fuse3, pip install -e '.[test]' (mfusepy), and a "
     "/dev/fuse device"),
)


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


def _fail_missing_in_ci(report: pytest.TestReport) -> None:
    if os.environ.get("CI") != "true" or not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = _skip_reason(report)
    for pattern, advice in _CI_REQUIRED:
        if pattern.search(reason):
            report.outcome = "failed"
            report.longrepr = (f"skipped in CI ({reason.removeprefix('Skipped: ')}): {advice}. "
                               f"CI=true turns this skip into a failure (tests/conftest.py).")
            return


# --------------------------------------------------------------------------------------------
# Attach broker logs to failing tests
# --------------------------------------------------------------------------------------------


def pytest_runtest_setup(item: pytest.Item) -> None:
    _item_start_index[item.nodeid] = len(ALL_BROKERS)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
    report = yield
    _fail_missing_in_ci(report)
    if report.failed and report.when in ("setup", "call"):
        start = _item_start_index.get(item.nodeid, len(ALL_BROKERS))
        for index, proc in enumerate(ALL_BROKERS):
            if index >= start or proc.alive:
                state = "running" if proc.alive else f"exited {proc.proc and proc.proc.returncode}"
                report.sections.append((
                    f"broker {proc.workdir.name} (pid {proc.proc and proc.proc.pid}, {state}) "
                    f"stderr tail: {proc.log_path}",
                    proc.log_tail(80),
                ))
    return report


# --------------------------------------------------------------------------------------------
# Two worker processes (pytest-xdist, ``-n 2 --dist loadfile`` in pyproject's addopts)
# --------------------------------------------------------------------------------------------

# Work units that share something outside the test process, so they must never run at the
# same time on two workers: each prefix is one unit (every test under it on one worker, one
# after another). tests/spark_connector: one SparkSession (a JVM, 5-30 s to start, 2 cores of
# local[2]) per worker process; one unit starts it once. tests/bench: the cluster bench holds
# the host-wide CPU latency request (/dev/cpu_dma_latency) that test_hosttune.py reads.
_SHARED_UNITS = ("tests/spark_connector/", "tests/bench/")

# Units handed out first, longest first: a long unit handed out last leaves one worker running
# it alone while the other idles (longest-job-first packing). Measured in a two-worker run with
# --durations=0 on the 2-core box: tests/spark_connector/ 185 s, test_chaos_run.py 156 s (the
# next file took 89 s), tests/bench/ 43 s in two long bench runs. Anything not listed follows,
# the file with the most tests first (xdist's default order).
_LONG_UNITS = (
    "tests/chaos/test_chaos_run.py",
    "tests/spark_connector/",
    "tests/bench/",
)


def _unit_of(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    for prefix in _SHARED_UNITS:
        if path.startswith(prefix):
            return prefix
    return path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` with the units above: a file's tests (and its module fixtures) stay
    on one worker, the shared units stay whole, and the long units go first. Other --dist
    modes are xdist's own."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SuiteScheduling(LoadFileScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return _unit_of(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            if not self.ordered:  # the first call: the queue is complete, nothing handed out
                self.ordered = True

                def rank(unit: str) -> int:
                    return next((i for i, p in enumerate(_LONG_UNITS) if unit.startswith(p)),
                                len(_LONG_UNITS))

                units = sorted(self.workqueue.items(), key=lambda kv: rank(kv[0]))  # stable
                self.workqueue.clear()
                self.workqueue.update(units)
            super()._assign_work_unit(node)

    return SuiteScheduling(config, log)
