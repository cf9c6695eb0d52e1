"""bench/hosttune.py: the CPU latency QoS request the latency workload holds is really held, and
really withdrawn afterwards (reading /dev/cpu_dma_latency returns the kernel's current target)."""

from __future__ import annotations

import os
import struct

import pytest

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


def test_cpuidle_info_only_reports_what_exists() -> None:
    info = cpuidle_info()
    assert set(info) <= {"cpuidle_driver", "cpuidle_governor", "guest_halt_poll_ns"}
    assert all(isinstance(v, str) and v for v in info.values())
