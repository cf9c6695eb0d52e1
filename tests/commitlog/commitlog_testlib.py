"""Helpers shared by the commit log tests (real files under tmp_path, no mocks)."""

from __future__ import annotations

import shutil
from pathlib import Path

from commitlog.store import LogStore


def payload_for(key: str, offset: int) -> bytes:
    """Deterministic payload so a test can check content, not just counts."""
    return f"{key}:{offset}".encode() * 3


def fill(store: LogStore, keys: list[str], per_key: int, ts0: int = 1_000_000,
         batch: int = 50) -> None:
    """Append per_key records to every key, interleaved, committing every ``batch``."""
    n = 0
    for i in range(per_key):
        for k in keys:
            off = store.append(k, ts0 + n, f"t/{k}", 1, None, payload_for(k, i))
            assert off == i
            n += 1
            if n % batch == 0:
                store.flush_sync_commit()
    store.flush_sync_commit()


def crash_image(src: Path, dst: Path) -> Path:
    """Copy a live store's files as a crash would leave them (no close, no checkpoint)."""
    shutil.copytree(src, dst)
    return dst


C_HOOKS = ("c_encode_run", "c_decode_run", "c_read_run", "c_scan_run", "c_walk_run",
           "c_columns_run", "c_coalesce", "c_trim_count", "c_raw_run", "c_arrow_run")


def use_impl(monkeypatch, impl: str) -> None:
    """Run the commit log's loops in C ("c": skips when not built) or pure Python ("py").

    The hooks are looked up at call time, so patching the module attributes switches
    every store; subprocesses get COMMITLOG_PURE_PYTHON for "py"."""
    import pytest

    from commitlog import record

    if impl == "c":
        if not record.SPEEDUPS:
            pytest.skip("commitlog._speedups is not built")
        monkeypatch.delenv("COMMITLOG_PURE_PYTHON", raising=False)
    else:
        from commitlog import store

        for name in C_HOOKS:
            monkeypatch.setattr(record, name, None)
        monkeypatch.setattr(store.LogStore, "append", store._py_append)
        monkeypatch.setenv("COMMITLOG_PURE_PYTHON", "1")
