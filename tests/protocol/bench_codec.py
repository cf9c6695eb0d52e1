"""Codec throughput benchmark (a script, not a test): ``python tests/protocol/bench_codec.py``.

Measures, on one core, the decode rate of 64-byte-payload QoS 0 / QoS 1 PUBLISH packets coalesced
into 64 KiB reads, and the encode rate of ``publish_parts`` (+ per-subscriber packet id) and of
``encode_publish``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from broker.protocol import (  # noqa: E402
    Connect,
    PacketParser,
    Publish,
    ServerProtocol,
    encode,
    encode_publish,
    publish_parts,
)

PAYLOAD = bytes(range(64))
TOPIC = "devices/sensor-0042/telemetry"
CHUNK = 64 * 1024


def _best(fn, repeat: int = 7) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def bench_decode(qos: int, level: int) -> float:
    pkts = [
        Publish(TOPIC, PAYLOAD, qos, packet_id=(i % 65535) + 1 if qos else None)
        for i in range(4000)
    ]
    stream = b"".join(encode(p, level) for p in pkts)
    # split into 64 KiB reads, packets straddling the boundaries as on a real socket
    chunks = [stream[i : i + CHUNK] for i in range(0, len(stream), CHUNK)]
    rounds = 25
    count = len(pkts) * rounds

    def run() -> None:
        parser = PacketParser(protocol_level=level)
        feed = parser.feed
        n = 0
        for _ in range(rounds):
            for c in chunks:
                n += len(feed(c))
        assert n == count, n

    return count / _best(run)


def bench_server_protocol(qos: int, level: int) -> float:
    """Same stream through ``ServerProtocol.receive_data`` (parser + per-packet state checks)."""
    pkts = [
        Publish(TOPIC, PAYLOAD, qos, packet_id=(i % 65535) + 1 if qos else None)
        for i in range(4000)
    ]
    stream = b"".join(encode(p, level) for p in pkts)
    chunks = [stream[i : i + CHUNK] for i in range(0, len(stream), CHUNK)]
    con = encode(Connect("bench", level, protocol_name="MQIsdp" if level == 3 else "MQTT"), level)
    rounds = 25
    count = len(pkts) * rounds

    def run() -> None:
        proto = ServerProtocol(1 << 20, 10)
        proto.receive_data(con)
        receive = proto.receive_data
        n = 0
        for _ in range(rounds):
            for c in chunks:
                n += len(receive(c))
        assert n == count, n

    return count / _best(run)


def bench_parts(qos: int, level: int) -> float:
    n = 200_000

    def run() -> None:
        for i in range(n):
            head, tail = publish_parts(TOPIC, PAYLOAD, qos, False, False, None, level)
            if qos:
                b"".join((head, ((i & 0xFFFF) | 1).to_bytes(2, "big"), tail))

    return n / _best(run)


def bench_fanout(qos: int, level: int, subscribers: int = 100) -> float:
    """One ``publish_parts`` per message then ``[head, pid, tail]`` per subscriber."""
    n = 5000

    def run() -> None:
        for _ in range(n):
            head, tail = publish_parts(TOPIC, PAYLOAD, qos, False, False, None, level)
            out = []
            for s in range(subscribers):
                if qos:
                    out += (head, (s + 1).to_bytes(2, "big"), tail)
                else:
                    out += (head, tail)

    return n * subscribers / _best(run)


def bench_encode_publish(qos: int, level: int) -> float:
    pkt = Publish(TOPIC, PAYLOAD, qos, packet_id=1 if qos else None)
    n = 200_000

    def run() -> None:
        for _ in range(n):
            encode_publish(pkt, level)

    return n / _best(run)


def main() -> None:
    print(f"python {sys.version.split()[0]}; payload {len(PAYLOAD)} B, topic {TOPIC!r}")
    for level in (4, 5):
        for qos in (0, 1):
            print(
                f"level {level} QoS {qos}: "
                f"decode {bench_decode(qos, level) / 1e3:5.0f} k/s | "
                f"ServerProtocol {bench_server_protocol(qos, level) / 1e3:5.0f} k/s | "
                f"publish_parts+pid {bench_parts(qos, level) / 1e3:5.0f} k/s | "
                f"fan-out x100 {bench_fanout(qos, level) / 1e6:5.1f} M frames/s | "
                f"encode_publish {bench_encode_publish(qos, level) / 1e3:5.0f} k/s"
            )


if __name__ == "__main__":
    main()
