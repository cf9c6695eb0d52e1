"""Recovery when a segment in the middle of the store is missing (an operator or a tool removed
it): the contiguous prefix is kept, the segments after the gap are set aside untouched
(``*.log.orphaned-<ts>``, never deleted: they hold acknowledged data an operator may want),
a WARNING says so, and the store goes on appending after the prefix.

Kafka refuses to start on a log whose segments do not line up; we keep serving the prefix
instead and leave the rest for the operator, which is what the store's docstring promises.
The expected prefix comes from a reference copy of the same files with the tail segments
removed (no gap): the two must read the same.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from commitlog.store import LogStore


def _fill(directory: Path, settings) -> dict[str, list[bytes]]:
    written: dict[str, list[bytes]] = {"a": [], "b": []}
    st = LogStore.open(str(directory), settings)
    try:
        for i in range(400):
            key = "ab"[i % 2]
            payload = f"{key}-{i}-".encode() + b"x" * 40
            st.append(key, 1_000 + i, f"t/{key}", 1, None, payload)
            written[key].append(payload)
            if i % 10 == 9:
                st.flush_sync_commit()
        st.flush_sync_commit()
    finally:
        st.close()  # writes a checkpoint covering every segment
    return written


def _read_all(st: LogStore) -> dict[str, list[bytes]]:
    out = {}
    for key in sorted(st.keys()):
        start, end = st.log_range(key)
        assert start == 0, (key, start, end)
        out[key] = [bytes(r.payload) for r in st.read(key, 0, end)]
        assert len(out[key]) == end, (key, len(out[key]), end)
    return out


@pytest.mark.parametrize("checkpoint", [True, False], ids=["with-checkpoint", "rescan"])
def test_gap_between_segments_keeps_the_prefix_and_sets_aside_the_rest(
        tmp_path, small_settings, checkpoint, caplog):
    live, ref = tmp_path / "log", tmp_path / "ref"
    written = _fill(live, small_settings)
    if not checkpoint:
        (live / "index.ckpt").unlink()
    segs = sorted(live.glob("*.log"))
    assert len(segs) >= 4, f"want several segments, got {[s.name for s in segs]}"
    tail = {s.name: s.read_bytes() for s in segs[3:]}
    shutil.copytree(live, ref)
    for s in segs[2:]:
        (ref / s.name).unlink()  # the reference: the same prefix, no gap
    segs[2].unlink()  # the gap

    with caplog.at_level("WARNING", logger="meshmq.commitlog"):
        st = LogStore.open(str(live), small_settings)
    try:
        assert any("does not start where" in r.getMessage() for r in caplog.records)
        with LogStore.open(str(ref), small_settings) as reference:
            expected = _read_all(reference)
        got = _read_all(st)
        assert got == expected, "the gap store does not hold the contiguous prefix"
        for key, payloads in got.items():
            assert payloads == written[key][: len(payloads)], f"{key}: not a prefix"
        assert sum(map(len, got.values())) < sum(map(len, written.values()))
        # Set aside, byte for byte; nothing after the gap was deleted or rewritten.
        for name, data in tail.items():
            kept = list(live.glob(name + ".orphaned-*"))
            assert len(kept) == 1 and kept[0].read_bytes() == data, (name, kept)
            assert not (live / name).exists()
        # The log goes on after the prefix, densely, and survives a reopen.
        n_a = len(got.get("a", []))
        assert st.append("a", 9_999, "t/a", 1, None, b"after-gap") == n_a
        st.flush_sync_commit()
    finally:
        st.close()
    with LogStore.open(str(live), small_settings) as again:
        final = _read_all(again)
    assert final["a"] == got["a"] + [b"after-gap"]
    assert final["b"] == got["b"]
