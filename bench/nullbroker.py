"""A "null broker" to measure the load generator's own ceiling (``--brokers null``).

It answers CONNECT and SUBSCRIBE, then copies every byte a publisher sends, unparsed, to every
subscriber connection. That is only a valid MQTT broker for the single-topic QoS 0 workloads
(qos0, large), which is all it is for: whatever rate it reaches is the generator's limit, not a
broker's.

``NULLBROKER_SPIN_NS_PER_BYTE=<ns>`` makes it busy-wait that long per forwarded byte: an "ideal"
broker that costs a chosen CPU time per message and has no allocation, GC or queueing of its
own. Run ``latency`` against it at a broker's per-message cost to see what the machine alone
(steal, scheduling) does to the tail at that utilisation.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

SPIN_NS_PER_BYTE = float(os.environ.get("NULLBROKER_SPIN_NS_PER_BYTE", "0") or 0)

SUBS: list[asyncio.Transport] = []


class Link(asyncio.Protocol):
    def __init__(self) -> None:
        self.buf = bytearray()
        self.state = "connect"  # -> "idle" -> "pub" | "sub"
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        if self.transport in SUBS:
            SUBS.remove(self.transport)

    def data_received(self, data: bytes) -> None:
        if self.state == "pub":
            if SPIN_NS_PER_BYTE:
                end = time.perf_counter_ns() + int(len(data) * SPIN_NS_PER_BYTE)
                while time.perf_counter_ns() < end:
                    pass
            for t in SUBS:
                t.write(data)
            return
        self.buf += data
        while self.state != "pub" and len(self.buf) >= 2:
            first = self.buf[0]
            rl, mult, j = 0, 1, 1
            while True:
                if j >= len(self.buf):
                    return
                b = self.buf[j]
                j += 1
                rl += (b & 0x7F) * mult
                mult <<= 7
                if not b & 0x80:
                    break
            if len(self.buf) < j + rl:
                return
            body = bytes(self.buf[j:j + rl])
            del self.buf[:j + rl]
            kind = first >> 4
            if kind == 1:  # CONNECT
                self.transport.write(b"\x20\x02\x00\x00")
                self.state = "idle"
            elif kind == 8:  # SUBSCRIBE: grant QoS 0 to every filter
                n = 0
                i = 2
                while i < len(body):
                    i += 2 + ((body[i] << 8) | body[i + 1]) + 1
                    n += 1
                self.transport.write(bytes([0x90, 2 + n]) + body[:2] + b"\x00" * n)
                if self.transport not in SUBS:
                    SUBS.append(self.transport)
                self.state = "sub"
            elif kind == 14:  # DISCONNECT
                self.transport.close()
                return
            elif kind == 3 and self.state == "idle":  # first PUBLISH: a publisher
                self.state = "pub"
                rest = bytes([first]) + bytes(data[:0])
                whole = rest + _varint(rl) + body + bytes(self.buf)
                self.buf.clear()
                for t in SUBS:
                    t.write(whole)
                return


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


async def main(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(Link, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    import uvloop

    uvloop.run(main(int(sys.argv[1])))
