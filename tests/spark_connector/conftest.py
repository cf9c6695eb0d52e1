"""Fixtures for the Spark connector tests: ONE SparkSession for the whole test session (a JVM
start costs 5-30 s on a loaded 2-core box), real broker processes, a paho publisher.

The session runs ``local[2]`` with its scratch space (``spark.local.dir``, ``java.io.tmpdir``)
under pytest's tmp dir, no UI, 2 shuffle partitions, and workers on this interpreter
(``PYSPARK_PYTHON``; pitfall 1 of notes/spark-python-datasource.md). The checkout is put on
``PYTHONPATH`` so PySpark's data-source discovery sees ``pyspark_meshmq`` under an editable
install too; no test calls ``spark_connector.register``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

try:
    import pyspark  # noqa: F401
except ImportError:  # pragma: no cover - a broken install, not a reason to skip silently
    pytest.fail("pyspark is missing: install the test extras with "
                "`pip install -e '.[test,spark]'` (see README, 'Run the tests')",
                pytrace=False)

from helpers.broker import BrokerProc  # noqa: E402
from helpers.spark import spark_conf, spark_env  # noqa: E402


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from pyspark.sql import SparkSession

    tmp = tmp_path_factory.mktemp("spark-local")
    os.environ.update(spark_env(tmp))
    builder = SparkSession.builder.master("local[2]").appName("meshmq-tests")
    for key, value in spark_conf(tmp).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    for q in session.streams.active:
        q.stop()
    session.stop()


@pytest.fixture(scope="session")
def shared_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProc]:
    """One broker for tests that use their own device ids (``devices`` option)."""
    proc = BrokerProc(tmp_path_factory.mktemp("spark-broker"), {"log": {"level": "info"}})
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def new_broker(tmp_path: Path) -> Iterator[Callable[..., BrokerProc]]:
    """Factory of brokers with config overrides, stopped (by PID) at the end of the test."""
    made: list[BrokerProc] = []

    def make(**overrides: Any) -> BrokerProc:
        overrides.setdefault("log", {"level": "info"})
        proc = BrokerProc(tmp_path / f"broker{len(made)}", overrides)
        made.append(proc)
        return proc.start()

    yield make
    for proc in made:
        proc.stop()
