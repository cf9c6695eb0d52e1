"""What a subscriber got of a stream of numbered payloads, and the promise checked on it:
every committed one delivered, none older after a newer one, none twice (the per-device order
a leader change, a restart or a resend must keep). Shared by the cluster's delivery tests."""

from __future__ import annotations

import time


def collect(sub, want: list[str], timeout: float = 60.0, settle: float = 1.5,
            skip: str = "probe") -> list[str]:
    """The payloads ``sub`` gets (those starting with ``skip`` left out) until it holds all of
    ``want``, then for ``settle`` seconds more (a late copy must show)."""
    got: list[str] = []
    deadline = time.monotonic() + timeout
    while not set(want) <= set(got) and time.monotonic() < deadline:
        got.extend(p for p in (m.payload.decode() for m in sub.drain())
                   if not (skip and p.startswith(skip)))
        time.sleep(0.05)
    time.sleep(settle)
    got.extend(p for p in (m.payload.decode() for m in sub.drain())
               if not (skip and p.startswith(skip)))
    return got


def check_stream(want: list[str], got: list[str]) -> None:
    """Every payload of ``want`` in ``got``, and ``got`` in ``want``'s order without repeats."""
    index = {p: i for i, p in enumerate(want)}
    missing = [p for p in want if p not in got]
    assert not missing, f"committed, never delivered: {missing[:12]} (got {got[-12:]})"
    back = [(a, b) for a, b in zip(got, got[1:], strict=False) if index[b] <= index[a]]
    assert not back, (f"an older message after a newer one (or again): {back[:6]}; "
                      f"stream tail {got[-30:]}")
