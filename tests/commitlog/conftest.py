"""Fixtures for the commit log tests.

Every test in this folder runs twice: with the compiled fast path (``commitlog._speedups``,
skipped when it is not built) and with the pure-Python loops (the reference).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# Test modules import commitlog_testlib; with --import-mode=importlib the test folder is
# not on sys.path by itself (same pattern as tests/conftest.py uses for helpers/).
sys.path.insert(0, str(Path(__file__).resolve().parent))

from commitlog_testlib import use_impl

from commitlog.settings import LogSettings


@pytest.fixture(autouse=True, params=["c", "py"])
def impl(request, monkeypatch) -> str:
    """Which implementation of the per-record loops this test runs ("c" or "py")."""
    use_impl(monkeypatch, request.param)
    return request.param


@pytest.fixture
def small_settings() -> LogSettings:
    """Tiny segments and index interval, no tail cache: exercises rolls and disk reads."""
    return LogSettings(segment_bytes=4096, index_interval_bytes=256,
                       tail_cache_bytes_per_device=0, retention_ms=0)
