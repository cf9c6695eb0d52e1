"""``python -m bench.catchup``: how fast a lagging session is fed from the log, beside live QoS 1.

A session that falls behind on a logged topic reads its backlog from the device log
(broker/catchup.py). The target (issue 18) is that this catch-up runs at least as fast as live
QoS 1 delivery, so a subscriber that lagged does not stay behind. Both are measured on one meshmq
node in the same run, with the same 3.1.1 subscriber (acks every PUBLISH at once) and the same
pipelined publisher (window 1,000, 64-byte payloads):

* live: subscriber connected; rate = messages received / time from first publish to last receipt;
* catch-up: a persistent session (clean session 0) offline while N messages are published and
  acknowledged; rate = N / time from CONNECT to the N-th receipt.

Mosquitto is not run: with its defaults (max_queued_messages 1000) it keeps 1,000 of the N.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import struct
import time

from bench import mqttpkt as mp
from bench.brokers import Broker

PAYLOAD = b"x" * 64
TOPIC = "devices/bench-catchup/telemetry"


class _Stream:
    """A minimal MQTT 3.1.1 connection: counts PUBLISH/PUBACK, acks QoS 1 PUBLISH in batches."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.buf = bytearray()
        self.publishes = 0
        self.pubacks = 0

    @classmethod
    async def open(cls, port: int, client_id: str, clean: bool) -> _Stream:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        s = cls(reader, writer)
        writer.write(mp.connect(client_id, clean=clean))
        await s.until(lambda: False, connack=True)
        return s

    async def until(self, done, connack: bool = False, suback: bool = False) -> None:
        first_pass = True
        while True:
            if not first_pass:  # what an earlier read left in the buffer is handled first
                data = await self.reader.read(1 << 20)
                if not data:
                    raise ConnectionError("closed by the broker")
                self.buf += data
            first_pass = False
            acks = []
            i = 0
            while True:
                p = mp.split_packet(self.buf, i)
                if p is None:
                    break
                first, body, end = p
                kind = first & 0xF0
                if kind == mp.PUBLISH:
                    self.publishes += 1
                    if first & 0x06:
                        tlen = struct.unpack_from(">H", self.buf, body)[0]
                        acks.append(mp.ack(mp.PUBACK, struct.unpack_from(
                            ">H", self.buf, body + 2 + tlen)[0]))
                elif kind == mp.PUBACK:
                    self.pubacks += 1
                elif kind == mp.CONNACK and connack:
                    connack = False
                    del self.buf[:end]
                    return
                elif kind == mp.SUBACK and suback:
                    suback = False
                    del self.buf[:end]
                    return
                i = end
            del self.buf[:i]
            if acks:
                self.writer.write(b"".join(acks))
            if done() and i:
                return


async def _publish(port: int, n: int, window: int = 1000) -> None:
    pub = await _Stream.open(port, "bench-catchup-pub", True)
    sent = 0
    while sent < n or pub.pubacks < n:
        room = min(window - (sent - pub.pubacks), n - sent)
        if room > 0:
            pub.writer.write(b"".join(mp.publish(TOPIC, PAYLOAD, 1, (sent + k) % 65535 + 1)
                                      for k in range(room)))
            sent += room
        await pub.until(lambda: True)
    pub.writer.close()


async def _subscriber(port: int, cid: str, clean: bool) -> _Stream:
    sub = await _Stream.open(port, cid, clean)
    sub.writer.write(mp.subscribe(1, [(TOPIC, 1)]))
    await sub.until(lambda: False, suback=True)
    return sub


async def live_rate(port: int, n: int) -> float:
    sub = await _subscriber(port, "bench-live-sub", True)
    t0 = time.perf_counter()
    pub_task = asyncio.create_task(_publish(port, n))
    await sub.until(lambda: sub.publishes >= n)
    elapsed = time.perf_counter() - t0
    await pub_task
    sub.writer.close()
    return n / elapsed


async def catchup_rate(port: int, n: int) -> float:
    sub = await _subscriber(port, "bench-lag-sub", False)
    sub.writer.write(mp.disconnect())
    sub.writer.close()
    await asyncio.sleep(0.2)
    await _publish(port, n)
    t0 = time.perf_counter()
    again = await _Stream.open(port, "bench-lag-sub", False)
    await again.until(lambda: again.publishes >= n)
    elapsed = time.perf_counter() - t0
    again.writer.close()
    return n / elapsed


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.catchup", description=__doc__)
    ap.add_argument("-n", type=int, default=200_000, help="messages per run (default 200000)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print one JSON line")
    args = ap.parse_args(argv)
    live, lag = [], []
    for _ in range(args.rounds):
        for which, out in (("live", live), ("catchup", lag)):
            broker = Broker("meshmq")  # a fresh node per run: no backlog from the last one
            broker.start()
            try:
                fn = live_rate if which == "live" else catchup_rate
                out.append(asyncio.run(fn(broker.port, args.n)))
            finally:
                broker.stop()
    live_m, lag_m = sorted(live)[len(live) // 2], sorted(lag)[len(lag) // 2]
    result = {"n": args.n, "live_qos1_msg_s": live, "catchup_msg_s": lag,
              "median_live": live_m, "median_catchup": lag_m, "ratio": lag_m / live_m}
    if args.json:
        print(json.dumps(result))
        return
    print(f"meshmq, {args.n} QoS 1 messages of 64 bytes, {args.rounds} rounds (median):")
    print(f"  live QoS 1 1->1      {live_m:10,.0f} msg/s   rounds {[round(x) for x in live]}")
    print(f"  catch-up from log    {lag_m:10,.0f} msg/s   rounds {[round(x) for x in lag]}")
    print(f"  catch-up / live      {lag_m / live_m:10.2f}x   (target >= 1.0)")


if __name__ == "__main__":
    main()
