"""The salvage walk a reader makes over a corrupt record is bounded by the device's records,
not by the size of the log (review of issue 28, item 7).

A device that went quiet (a sensor that reported twice, then a hot fleet filled the log): its
last record rots after a clean close. ``LogStore._salvage`` looks for the device's next intact
record, and before this walked every byte of every later segment, synchronously, on the
router's event loop: about 0.25 s per 64 MiB segment on the review box, so a multi-GB log
froze every client of the router (keepalives, mesh link heartbeats) for minutes. The
device's sparse index (an entry at its first record in each segment) says which segments
hold its records at all; the walk skips the others (Kafka's reader likewise uses the offset
index, never a log scan).

The measure is bytes read by this process (``rchar`` in /proc/self/io: every read and pread,
page cache included), deterministic, not a timing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from commitlog_testlib import payload_for

from commitlog.record import HEADER, HEADER_SIZE
from commitlog.settings import LogSettings
from commitlog.store import LogStore

SEG = 64 * 1024
SEGMENTS = 24


def rchar() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def build(path: Path, settings: LogSettings) -> None:
    with LogStore.open(str(path), settings) as st:
        st.append("cold", 1, "devices/cold/t", 1, None, payload_for("cold", 0))
        st.append("cold", 1, "devices/cold/t", 1, None, payload_for("cold", 1))
        st.flush_sync_commit()
        i = 0

        def hot(n: int) -> None:
            nonlocal i
            for _ in range(n):
                st.append(f"hot{i % 8}", 1, "devices/hot/t", 1, None, b"h" * 100)
                i += 1
            st.flush_sync_commit()

        while len(list(path.glob("*.log"))) < SEGMENTS:
            hot(200)
        # the active segment mostly full too: it holds no "cold" record either
        while max(path.glob("*.log")).stat().st_size < 3 * SEG // 4:
            hot(20)


def flip_payload_of_second_record(seg: Path) -> None:
    data = bytearray(seg.read_bytes())
    first = HEADER.unpack_from(data, 0)[0]
    p = 4 + first
    length, *_rest = HEADER.unpack_from(data, p)
    assert data[p + HEADER_SIZE : p + HEADER_SIZE + 4] == b"cold"
    data[p + 4 + length - 2] ^= 0x01
    seg.write_bytes(bytes(data))


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux /proc/self/io")
def test_salvage_of_a_quiet_devices_last_record_reads_only_its_segments(tmp_path: Path):
    settings = LogSettings(segment_bytes=SEG, tail_cache_bytes_per_device=0, retention_ms=0)
    path = tmp_path / "log"
    build(path, settings)
    segs = sorted(path.glob("*.log"))
    total = sum(s.stat().st_size for s in segs)
    flip_payload_of_second_record(segs[0])

    with LogStore.open(str(path), settings) as st:
        before = rchar()
        got = st.read("cold", 0, 100, 1 << 30)
        used = rchar() - before
        assert [r.offset for r in got] == [0]
        assert st.lost_ranges("cold", 0, 2) == [(1, 2)]
        assert st.stats.corrupt_records == 1
        # The segment with the damage: never the 23 later ones that hold no "cold" record
        # (the active one included).
        assert used < SEG + SEG // 2, \
            f"the salvage walk read {used} bytes of a {total}-byte log"
        # a hot device's reads are untouched
        assert len(st.read("hot0", 0, 10, 1 << 30)) == 10
