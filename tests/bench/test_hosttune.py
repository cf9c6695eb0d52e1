"""bench/hosttune.py: the CPU latency QoS request the latency workload holds is really held, and
really withdrawn afterwards (reading /dev/cpu_dma_latency returns the kernel's current target)."""

from __future__ import annotations

import os
import struct

import pytest

from bench import hosttune
from bench.hosttune import CPU_LATENCY_DEV, cpu_latency_request, cpuidle_info


def _current_target_us() -> int:
    fd = os.open(CPU_LATENCY_DEV, os.O_RDONLY)
    try:
        return struct.unpack("=i", os.read(fd, 4))[0]
    finally:
        os.close(fd)


@pytest.mark.skipif(not os.access(CPU_LATENCY_DEV, os.R_OK | os.W_OK),
                    reason=f"{CPU_LATENCY_DEV} needs root")
def test_request_held_inside_and_withdrawn_after() -> None:
    before = _current_target_us()
    if before == 0:
        pytest.skip("another process already holds a 0 us request")
    with cpu_latency_request(0) as held:
        assert held == "held at 0 us"
        assert _current_target_us() == 0
    assert _current_target_us() == before


def test_without_the_device_the_run_goes_on_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("bench.hosttune.CPU_LATENCY_DEV", "/nonexistent/cpu_dma_latency")
    with cpu_latency_request(0) as held:
        assert held.startswith("not held (/nonexistent/cpu_dma_latency: No such file")


def _expected_cpuidle() -> dict[str, str]:
    """What cpuidle_info must report on this host: every file that exists, as it reads."""
    out = {}
    for key, path in (("cpuidle_driver", hosttune._CPUIDLE / "current_driver"),
                      ("cpuidle_governor", hosttune._CPUIDLE / "current_governor_ro"),
                      ("guest_halt_poll_ns", hosttune._HALTPOLL_NS)):
        try:
            out[key] = path.read_text().strip()
        except OSError:
            pass
    return out


def test_cpuidle_info_only_reports_what_exists() -> None:
    """Exactly what the host's files say: an empty result passes only where none exists."""
    info = cpuidle_info()
    assert info == _expected_cpuidle()
    assert all(isinstance(v, str) and v for v in info.values())


def test_cpuidle_info_reads_each_file(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Independent of this host: files that exist are reported with their (stripped) text, a
    missing one is left out."""
    idle = tmp_path / "cpuidle"
    idle.mkdir()
    (idle / "current_driver").write_text("haltpoll\n")
    (idle / "current_governor_ro").write_text("menu\n")
    monkeypatch.setattr(hosttune, "_CPUIDLE", idle)
    monkeypatch.setattr(hosttune, "_HALTPOLL_NS", tmp_path / "missing" / "guest_halt_poll_ns")
    assert cpuidle_info() == {"cpuidle_driver": "haltpoll", "cpuidle_governor": "menu"}
