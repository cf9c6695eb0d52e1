"""A bad byte range that many devices lost records in is copied to quarantine/ once (review of
issue 28, item 7).

A zeroed stretch of a segment (a bad sector run, a firmware bug) holds records of many devices.
Each device's first reader meets it and ``LogStore._salvage`` reports that device's loss, as it
should; before this it also copied the same bad range to quarantine/ again for every device
(and counted its bytes again in ``meshmq_log_corrupt_bytes_total``): 50 devices over a 512 KiB
zeroed range wrote 26 MB of copies, fsynced one by one on the event loop; with thousands of
devices and the 16 MiB cap per copy that fills the disk the log needs to go on storing. Each
range is copied once, across a restart too (the file already in quarantine/ is reused).
"""

from __future__ import annotations

from pathlib import Path

from commitlog.settings import LogSettings
from commitlog.store import LogStore

DEVICES = [f"dev{i}" for i in range(20)]
ZEROED = 64 * 1024


def test_a_range_many_devices_lost_records_in_is_quarantined_once(tmp_path: Path):
    settings = LogSettings(segment_bytes=256 * 1024, tail_cache_bytes_per_device=0,
                           retention_ms=0)
    path = tmp_path / "log"
    with LogStore.open(str(path), settings) as st:
        for i in range(8000):
            st.append(DEVICES[i % len(DEVICES)], 1, "devices/x/t", 1, None, b"p" * 80)
            if i % 500 == 499:
                st.flush_sync_commit()
        st.flush_sync_commit()
    segs = sorted(path.glob("*.log"))
    assert len(segs) >= 3
    with open(segs[1], "r+b") as f:  # clean close first: nothing scans this at open
        f.seek(10_000)
        f.write(b"\0" * ZEROED)

    half = len(DEVICES) // 2
    lost: dict[str, list[tuple[int, int]]] = {}
    with LogStore.open(str(path), settings) as st:
        for k in DEVICES[:half]:
            st.read(k, 0, 100_000, 1 << 30)
            lost[k] = st.lost_ranges(k, 0, 100_000)
        assert st.stats.corrupt_records == half  # each device's loss reported
        assert st.stats.corrupt_bytes <= ZEROED + 4096, st.stats.corrupt_bytes
    with LogStore.open(str(path), settings) as st:  # and after a restart
        for k in DEVICES[half:]:
            got = st.read(k, 0, 100_000, 1 << 30)
            lost[k] = st.lost_ranges(k, 0, 100_000)
            n_lost = sum(b - a for a, b in lost[k])
            assert len(got) + n_lost == 400, k  # every other record of it still served
        assert st.stats.corrupt_bytes == 0, st.stats.corrupt_bytes  # copied already
    assert all(lost.values()), lost  # every device had records in the zeroed range
    copies = list((path / "quarantine").glob("*.bad"))
    total = sum(f.stat().st_size for f in copies)
    assert total <= ZEROED + 4096, (
        f"{len(copies)} quarantine copies, {total} bytes, for one {ZEROED}-byte bad range")
