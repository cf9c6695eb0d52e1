"""Host state that decides tail latency more than any broker does: idle vCPUs halting.

On a VM whose idle vCPUs halt at once (this box: Firecracker, cpuidle driver ``haltpoll`` with
``guest_halt_poll_ns=0``), every message burst of the latency workload wakes a halted vCPU: a
VM exit, the host rescheduling the vCPU thread, caches refilled after other guests ran. Under host
load the rescheduling takes milliseconds (the "steal" bursts in our results) and the wake-up
itself costs each broker CPU. Measured here at 90k msg/s through meshmq, three A/B pairs:
p99 28 / 23 / 14 ms with the host as it is, 3.1 / 1.8 / 2.6 ms with the request below held, steal
3-33% vs 0-2% of a core; Mosquitto and amqtt move the same way (15.5 / 17.7 vs 6.7 / 4.0 ms).

The remedy operators use is the kernel's CPU latency QoS request: hold ``/dev/cpu_dma_latency``
open with a value of 0 us and cpuidle picks its polling state instead of halting (tuned's
``latency-performance`` profile does exactly this; the kernel's guest halt-polling is the
adaptive variant). The request lasts only while the file stays open, so nothing outlives the
bench, and it applies to every broker alike.
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Iterator
from pathlib import Path

CPU_LATENCY_DEV = "/dev/cpu_dma_latency"
_CPUIDLE = Path("/sys/devices/system/cpu/cpuidle")
_HALTPOLL_NS = Path("/sys/module/haltpoll/parameters/guest_halt_poll_ns")


@contextlib.contextmanager
def cpu_latency_request(max_us: int = 0) -> Iterator[str]:
    """Hold a CPU latency QoS request for the duration of the block; yields what was done.

    Never fails the run: without root (the device is 0600) or without the device the block runs
    on the host as it is, and the returned text says so, so the report can show it.
    """
    try:
        fd = os.open(CPU_LATENCY_DEV, os.O_WRONLY)
    except OSError as exc:
        yield f"not held ({CPU_LATENCY_DEV}: {exc.strerror}; it needs root)"
        return
    try:
        # pm_qos_interface.rst: "write an s32 value to the open device node"; closing the file
        # withdraws the request.
        os.write(fd, struct.pack("=i", max_us))
        yield f"held at {max_us} us"
    finally:
        os.close(fd)


def cpuidle_info() -> dict:
    """What the host's idle path does (recorded with every run: it moves latency by 10x)."""
    info: dict = {}
    for key, path in (("cpuidle_driver", _CPUIDLE / "current_driver"),
                      ("cpuidle_governor", _CPUIDLE / "current_governor_ro"),
                      ("guest_halt_poll_ns", _HALTPOLL_NS)):
        with contextlib.suppress(OSError):
            info[key] = path.read_text().strip()
    return info
