"""``UnroutedPeers`` (cluster/routegap.py) against a real LogStore: what a restarted router sends
a peer whose routes arrive late is bounded, because it is read synchronously on the event loop
(review3: a peer away for hours made the whole backlog since the restart one read, every record
of it queued onto a link that drops past cluster.link_max_queued_bytes anyway).

* routes arriving within the window: every routed record from its first offset is sent;
* routes arriving past ``GAP_MAX_S`` after the start: nothing is read, and the per-peer state is
  let go (``pending`` None, so ``Mesh.forward`` stops calling in);
* the link refuses a DELIVER as full: the read stops there, not at the log end;
* ``scan_max`` records read: the read stops there.
"""

from __future__ import annotations

from pathlib import Path

from cluster.routegap import GAP_MAX_S, UnroutedPeers
from commitlog.store import LogStore

DEV = "dev1"


class Clock:
    """A settable monotonic clock (the deadline is GAP_MAX_S: a test cannot wait it out)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _fill(st: LogStore, n: int) -> None:
    for i in range(n):
        st.append(DEV, 1, f"devices/{DEV}/t", 1, None, f"m{i}".encode())
    st.flush_sync_commit()


def test_routes_within_the_window_get_every_record_routed_before(tmp_path: Path) -> None:
    with LogStore.open(str(tmp_path / "log")) as st:
        _fill(st, 300)
        clock = Clock()
        gap = UnroutedPeers(["b"], st, 10, clock=clock)
        gap.routed(DEV, 20)
        clock.now += GAP_MAX_S / 2
        seen: list[int] = []
        assert gap.routes_known("b", lambda rec: seen.append(rec.offset) or True) == 280
        assert seen == list(range(20, 300))
        assert gap.pending is None


def test_routes_arriving_past_the_window_get_nothing_and_the_state_is_released(
        tmp_path: Path) -> None:
    with LogStore.open(str(tmp_path / "log")) as st:
        _fill(st, 300)
        clock = Clock()
        gap = UnroutedPeers(["b", "c"], st, 10, clock=clock)
        gap.routed(DEV, 0)
        clock.now += GAP_MAX_S + 1
        gap.routed(DEV, 299)  # a publish after the window: nobody is waited for any more
        assert gap.pending is None, f"still tracking peers past the window: {gap.pending}"
        seen: list[int] = []
        assert gap.routes_known("b", lambda rec: seen.append(rec.offset) or True) == 0
        assert seen == [], f"{len(seen)} records read for a peer whose routes came too late"


def test_a_full_link_stops_the_read(tmp_path: Path) -> None:
    with LogStore.open(str(tmp_path / "log")) as st:
        _fill(st, 3000)
        gap = UnroutedPeers(["b"], st, 10, clock=Clock())
        gap.routed(DEV, 0)
        calls: list[int] = []

        def send(rec: object) -> bool | None:
            calls.append(1)
            return True if len(calls) < 5 else None  # the fifth finds the link full

        assert gap.routes_known("b", send) == 4
        assert len(calls) == 5, f"{len(calls)} records tried after the link refused the 5th"


def test_the_read_stops_at_scan_max_records(tmp_path: Path) -> None:
    with LogStore.open(str(tmp_path / "log")) as st:
        _fill(st, 3000)
        gap = UnroutedPeers(["b"], st, 10, clock=Clock(), scan_max=1500)
        gap.routed(DEV, 0)
        calls: list[int] = []

        def send(rec: object) -> bool:
            calls.append(1)
            return False  # not for the peer (the costly case: nothing ever fills the link)

        assert gap.routes_known("b", send) == 0
        assert len(calls) == 1500, f"{len(calls)} records read with scan_max=1500"
