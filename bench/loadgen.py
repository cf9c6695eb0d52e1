"""The load generator: raw asyncio Protocols on uvloop, pre-encoded packets, closed-loop windows.

Each worker runs in its own process (forked by the coordinator, see ``runner.py``) so that the
publisher and the subscriber do not share one core. Workers talk to the coordinator through a
shared ``RawArray`` of int64 slots (no locks: every slot has exactly one writer):

* ``ctrl[GO]`` / ``ctrl[STOP]`` are written by the coordinator;
* each worker owns 8 slots from ``base``: READY, SENT, RECV, ACKED, BYTES, ERR, EXTRA, EXTRA2.

A QoS 0 publisher reads the subscribers' RECV slots to keep ``sent - received <= window``;
a QoS 1/2 publisher keeps at most ``window`` messages un-acknowledged on its own connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
import struct
import time
from array import array

from bench import mqttpkt as mp

GO, STOP = 0, 1
HEADER_SLOTS = 16
WORKER_SLOTS = 8
READY, SENT, RECV, ACKED, BYTES, ERR, EXTRA, EXTRA2 = range(8)

HOST = "127.0.0.1"


def raise_nofile() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class Conn(asyncio.Protocol):
    """One MQTT connection. Before ``set_handler`` it buffers packets for the handshake."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.handler = None
        self.waiter: asyncio.Future | None = None
        self.lost = False
        self.can_write = True

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        h = self.handler
        if h is not None:
            h(data)
            return
        self.buf += data
        self._wake()

    def connection_lost(self, exc) -> None:
        self.lost = True
        self._wake()

    def pause_writing(self) -> None:
        self.can_write = False

    def resume_writing(self) -> None:
        self.can_write = True

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def read_packet(self) -> tuple[int, bytes]:
        while True:
            p = mp.split_packet(self.buf)
            if p is not None:
                first, j, end = p
                body = bytes(self.buf[j:end])
                del self.buf[:end]
                return first, body
            if self.lost:
                raise ConnectionError("connection closed by broker")
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter

    def set_handler(self, handler) -> None:
        self.handler = handler
        if self.buf:
            data = bytes(self.buf)
            self.buf.clear()
            handler(data)

    def write(self, data: bytes) -> None:
        self.transport.write(data)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


async def open_conn(port: int, client_id: str, subs: list[tuple[str, int]] | None = None,
                    per_packet: int = 100) -> Conn:
    """Connect, wait for CONNACK, optionally subscribe (pipelined, ``per_packet`` filters each)."""
    loop = asyncio.get_running_loop()
    _, conn = await loop.create_connection(Conn, HOST, port)
    conn.write(mp.connect(client_id))
    first, body = await conn.read_packet()
    if first != mp.CONNACK or len(body) < 2 or body[1] != 0:
        raise ConnectionError(f"bad CONNACK {first:#x} {body!r}")
    if subs:
        chunks = [subs[i:i + per_packet] for i in range(0, len(subs), per_packet)]
        conn.write(b"".join(mp.subscribe(k + 1, c) for k, c in enumerate(chunks)))
        for _ in chunks:
            first, body = await conn.read_packet()
            if first != mp.SUBACK:
                raise ConnectionError(f"expected SUBACK, got {first:#x}")
            if 0x80 in body[2:]:
                raise ConnectionError("subscription refused")
    return conn


# --------------------------------------------------------------------------------------------
# Incoming-byte handlers. Hot path: a stream of equally sized PUBLISH packets is checked and
# counted with strided slices (C speed); anything else falls back to a per-packet scan.
# --------------------------------------------------------------------------------------------


class SubCounter:
    """Counts PUBLISH packets arriving on one subscriber connection; acks QoS 1/2."""

    __slots__ = ("conn", "arr", "slot_recv", "slot_bytes", "rest", "size", "b0", "b1", "pid_off",
                 "qos", "count")

    def __init__(self, conn: Conn, arr, base: int, topic: str, payload_len: int, qos: int):
        self.conn = conn
        self.arr = arr
        self.slot_recv = base + RECV
        self.slot_bytes = base + BYTES
        self.rest = b""
        self.qos = qos
        prefix = mp.publish_prefix(topic, payload_len, qos)
        self.size = len(prefix) + (2 if qos else 0) + payload_len
        self.b0 = prefix[0]
        self.b1 = prefix[1]
        self.pid_off = len(prefix)
        self.count = 0

    def __call__(self, data: bytes) -> None:
        buf = self.rest + data if self.rest else data
        size = self.size
        n = len(buf) // size
        end = n * size
        if (n and self.qos != 2 and buf[0:end:size].count(self.b0) == n
                and buf[1:end:size].count(self.b1) == n):
            if self.qos == 1:
                out = bytearray(4 * n)
                out[0::4] = b"\x40" * n
                out[1::4] = b"\x02" * n
                off = self.pid_off
                out[2::4] = buf[off:end:size]
                out[3::4] = buf[off + 1:end:size]
                self.conn.transport.write(out)
            self.rest = buf[end:]
            got = n
        else:
            got = self._scan(buf)
        if got:
            self.count += got
            arr = self.arr
            arr[self.slot_recv] += got
            arr[self.slot_bytes] += got * size

    def _scan(self, buf: bytes) -> int:
        i = 0
        got = 0
        out = []
        split = mp.split_packet
        while True:
            p = split(buf, i)
            if p is None:
                break
            first, j, end = p
            t = first >> 4
            if t == 3:
                got += 1
                q = (first >> 1) & 3
                if q:
                    tl = (buf[j] << 8) | buf[j + 1]
                    pid = buf[j + 2 + tl:j + 4 + tl]
                    out.append((b"\x40\x02" if q == 1 else b"\x50\x02") + pid)
            elif t == 6:  # PUBREL -> PUBCOMP
                out.append(b"\x70\x02" + buf[j:j + 2])
            i = end
        if out:
            self.conn.transport.write(b"".join(out))
        self.rest = buf[i:]
        return got


class AckPump:
    """A QoS 1/2 publisher on one connection: at most ``window`` messages un-acknowledged.

    Ack-clocked: every batch of PUBACKs (or PUBCOMPs) read refills the window from a ring of
    pre-encoded PUBLISH packets, so no timer or polling is involved.
    """

    def __init__(self, conn: Conn, arr, base: int, topic: str, payload: bytes, qos: int,
                 window: int, recv_slots: tuple[int, ...] = ()):
        self.conn = conn
        # A broker acks on receipt, not on delivery: also bound what the subscriber has yet to
        # receive, or the broker's queue for the subscriber would grow without limit.
        self.recv_slots = recv_slots
        self.recv_window = 2 * window
        self.arr = arr
        self.base = base
        self.qos = qos
        self.window = window
        self.ring, self.size = mp.publish_ring(topic, payload, qos)
        self.next_idx = 0
        self.sent = 0
        self.done = 0
        self.rest = b""
        self.stopped = False
        self.batch = max(1, min(64, window // 4))

    def start(self) -> None:
        self.conn.set_handler(self.on_data)
        self.refill()

    def refill(self) -> None:
        if self.stopped:
            return
        room = self.window - (self.sent - self.done)
        if self.recv_slots:
            recv = 0
            for s in self.recv_slots:
                recv += self.arr[s]
            room = min(room, self.recv_window - (self.sent - recv))
        if room < self.batch:
            return
        start = self.next_idx
        size = self.size
        self.conn.transport.write(self.ring[start * size:(start + room) * size])
        self.next_idx = (start + room) % 65535
        self.sent += room
        self.arr[self.base + SENT] = self.sent

    def on_data(self, data: bytes) -> None:
        buf = self.rest + data if self.rest else data
        n = len(buf) // 4
        end = n * 4
        self.rest = buf[end:]
        if not n:
            return
        heads = buf[0:end:4]
        if self.qos == 1:
            done = heads.count(mp.PUBACK)
            if done != n:
                done = self._scan(buf[:end])
        else:
            recs = heads.count(mp.PUBREC)
            done = heads.count(mp.PUBCOMP)
            if recs == n:
                out = bytearray(buf[:end])
                out[0::4] = bytes([mp.PUBREL]) * n
                self.conn.transport.write(out)
            elif recs + done == n:
                out = bytearray()
                for k in range(0, end, 4):
                    if buf[k] == mp.PUBREC:
                        out += bytes([mp.PUBREL, 2]) + buf[k + 2:k + 4]
                self.conn.transport.write(out)
            else:
                done = self._scan(buf[:end])
        if done:
            self.done += done
            self.arr[self.base + ACKED] = self.done
        self.refill()

    def _scan(self, buf: bytes) -> int:
        # Some packet is not 4 bytes long (not expected from a conforming broker): walk it.
        i = 0
        done = 0
        out = bytearray()
        while True:
            p = mp.split_packet(buf, i)
            if p is None:
                break
            first, j, end = p
            if first == mp.PUBACK or first == mp.PUBCOMP:
                done += 1
            elif first == mp.PUBREC:
                out += bytes([mp.PUBREL, 2]) + buf[j:j + 2]
            i = end
        if out:
            self.conn.transport.write(out)
        self.rest = buf[i:] + self.rest
        return done


def _ignore(_data: bytes) -> None:
    return None


# --------------------------------------------------------------------------------------------
# Workers
# --------------------------------------------------------------------------------------------


async def _wait_flag(arr, idx: int, deadline: float) -> bool:
    while not arr[idx]:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.002)
    return True


async def _connect_many(port: int, prefix: str, n: int, subs_for, concurrency: int = 200):
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> Conn:
        async with sem:
            return await open_conn(port, f"{prefix}-{i}", subs_for(i) if subs_for else None)

    return await asyncio.gather(*(one(i) for i in range(n)))


async def w_sub(p: dict, arr, base: int) -> dict:
    """Subscribers: n connections, each subscribed to ``filter`` (or connection i to
    ``filters[i]``: topics of one length, so one packet size); count deliveries."""
    filters = p.get("filters") or [p["filter"]] * p["n"]
    conns = await _connect_many(p["port"], f"{p['tag']}-sub{base}", p["n"],
                                lambda i: [(filters[i], p["qos"])])
    for c in conns:
        c.set_handler(SubCounter(c, arr, base, p["topic"], p["payload_len"], p["qos"]))
    arr[base + READY] = 1
    await _wait_flag(arr, STOP, p["deadline"])
    return {"connections": len(conns), "lost": sum(c.lost for c in conns)}


async def w_idle_subs(p: dict, arr, base: int) -> dict:
    """Idle subscriptions that match nothing the workload publishes (the ``trie`` workload)."""
    n, per = p["n_conns"], p["filters"] // p["n_conns"]

    def subs_for(i: int) -> list[tuple[str, int]]:
        return [(f"idle/{i * per + k}/+/x", 0) for k in range(per)]

    conns = await _connect_many(p["port"], f"{p['tag']}-idle", n, subs_for, concurrency=n)
    for c in conns:
        c.set_handler(_ignore)
    arr[base + READY] = 1
    arr[base + EXTRA] = n * per
    await _wait_flag(arr, STOP, p["deadline"])
    return {"filters": n * per}


async def w_pub0(p: dict, arr, base: int) -> dict:
    """QoS 0 publishers: keep ``sent - received/fanout <= window`` using the subscribers' slots."""
    topics = p["topics"]
    conns = await _connect_many(p["port"], f"{p['tag']}-pub{base}", len(topics), None)
    payload = b"x" * p["payload_len"]
    per = p["batch"]
    batches = [mp.publish(t, payload) * per for t in topics]
    for c in conns:
        c.set_handler(_ignore)
    arr[base + READY] = 1
    if not await _wait_flag(arr, GO, p["deadline"]):
        return {"error": "no GO"}
    recv_slots = p["recv_slots"]
    fanout = p["fanout"]
    window = p["window"]
    nconn = len(conns)
    sent = 0
    ci = 0
    sleep = asyncio.sleep
    while not arr[STOP]:
        recv = 0
        for s in recv_slots:
            recv += arr[s]
        if fanout > 1:
            recv //= fanout
        room = window - (sent - recv)
        wrote = 0
        tries = 0
        while room >= per and tries < nconn:
            c = conns[ci]
            batch = batches[ci]
            ci += 1
            if ci == nconn:
                ci = 0
            if c.can_write:
                c.transport.write(batch)
                sent += per
                room -= per
                wrote += 1
                tries = 0
            else:
                tries += 1
        arr[base + SENT] = sent
        await sleep(0 if wrote and room >= per else 0.001)
        if time.monotonic() > p["deadline"]:
            break
    return {"connections": nconn, "lost": sum(c.lost for c in conns)}


async def w_pubn(p: dict, arr, base: int) -> dict:
    """A QoS 1/2 publisher: ack-clocked window."""
    conn = await open_conn(p["port"], f"{p['tag']}-pub{base}")
    pump = AckPump(conn, arr, base, p["topic"], b"x" * p["payload_len"], p["qos"], p["window"],
                   tuple(p["recv_slots"]))
    conn.set_handler(_ignore)
    arr[base + READY] = 1
    if not await _wait_flag(arr, GO, p["deadline"]):
        return {"error": "no GO"}
    pump.start()
    while not arr[STOP] and time.monotonic() < p["deadline"]:
        await asyncio.sleep(0.001)  # acks clock the pump; this only restarts it when the
        pump.refill()  # subscriber-side window (not the ack window) was the limit
    pump.stopped = True
    return {"sent": pump.sent, "acked": pump.done, "lost": conn.lost}


async def w_latency(p: dict, arr, base: int) -> dict:
    """Open loop at a fixed rate; publisher and subscriber in this one process so that the
    ``perf_counter_ns`` stamps in the payload and the receive times share a clock. The
    subscriber may connect elsewhere (``sub_port``: another node of a cluster)."""
    port, topic, rate = p["port"], p["topic"], float(p["rate"])
    sub = await open_conn(p.get("sub_port") or port, f"{p['tag']}-lsub", [(topic, 0)])
    pub = await open_conn(port, f"{p['tag']}-lpub")
    pub.set_handler(_ignore)
    prefix = mp.publish_prefix(topic, 64, 0)
    size = len(prefix) + 64
    off = len(prefix)
    pad = b"x" * 56
    stamp = struct.Struct(">q")
    samples = array("q")
    state = {"rest": b"", "recv": 0, "from": 1 << 62, "to": 1 << 62}
    b0, b1 = prefix[0], prefix[1]

    def on_data(data: bytes) -> None:
        now = time.perf_counter_ns()
        buf = state["rest"] + data if state["rest"] else data
        n = len(buf) // size
        end = n * size
        if n and (buf[0:end:size].count(b0) != n or buf[1:end:size].count(b1) != n):
            arr[base + ERR] += 1  # unexpected packet: resynchronise by scanning
            i, starts = 0, []
            while (q := mp.split_packet(buf, i)) is not None:
                if q[0] >> 4 == 3 and q[2] - i == size:
                    starts.append(i)
                i = q[2]
            state["rest"] = buf[i:]
            n = len(starts)
        else:
            starts = range(0, end, size)
            state["rest"] = buf[end:]
        lo, hi = state["from"], state["to"]
        unpack = stamp.unpack_from
        for k in starts:
            ts = unpack(buf, k + off)[0]
            if lo <= ts < hi:
                samples.append(now - ts)
        state["recv"] += n
        arr[base + RECV] = state["recv"]

    sub.set_handler(on_data)
    arr[base + READY] = 1
    if not await _wait_flag(arr, GO, p["deadline"]):
        return {"error": "no GO"}
    t0 = time.perf_counter_ns()
    state["from"] = t0 + int(p["warmup"] * 1e9)
    t_end = t0 + int((p["warmup"] + p["duration"]) * 1e9)
    state["to"] = t_end
    sent = 0
    while not arr[STOP]:
        now = time.perf_counter_ns()
        if now >= t_end:
            break
        due = int((now - t0) * rate / 1e9) - sent
        if due > 0:
            pub.transport.write((prefix + stamp.pack(now) + pad) * due)
            sent += due
            arr[base + SENT] = sent
        await asyncio.sleep(0.001)
    sent_in_window = int(p["duration"] * rate)
    # Let late deliveries arrive (bounded).
    grace_end = time.monotonic() + p.get("grace", 2.0)
    while len(samples) < sent_in_window and time.monotonic() < grace_end and not sub.lost:
        await asyncio.sleep(0.01)
    lat = sorted(samples)
    out = {"sent": sent, "received": state["recv"], "samples": len(lat),
           "expected_samples": sent_in_window, "rate": rate}
    if lat:
        def pct(q: float) -> float:
            return lat[min(len(lat) - 1, int(q * len(lat)))] / 1e6
        out.update(p50_ms=pct(0.50), p99_ms=pct(0.99), p999_ms=pct(0.999), max_ms=lat[-1] / 1e6)
    return out


async def w_storm(p: dict, arr, base: int) -> dict:
    """Connect ``n`` clients as fast as the broker accepts them; hold them (idle) until STOP."""
    n = p["n"]
    sem = asyncio.Semaphore(p["concurrency"])
    conns: list[Conn] = []
    errors = 0

    async def one(i: int) -> None:
        nonlocal errors
        async with sem:
            try:
                c = await asyncio.wait_for(open_conn(p["port"], f"{p['tag']}-st-{i}"),
                                           p["connect_timeout"])
                c.set_handler(_ignore)
                conns.append(c)
            except (TimeoutError, OSError, ConnectionError):
                errors += 1

    if not await _wait_flag(arr, GO, p["deadline"]):
        return {"error": "no GO"}
    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    dt = time.perf_counter() - t0
    arr[base + RECV] = len(conns)
    arr[base + ERR] = errors
    arr[base + EXTRA] = int(dt * 1e9)
    arr[base + READY] = 1
    await _wait_flag(arr, STOP, p["deadline"])
    return {"connected": len(conns), "errors": errors, "seconds": dt,
            "lost": sum(c.lost for c in conns)}


WORKERS = {
    "sub": w_sub,
    "idle_subs": w_idle_subs,
    "pub0": w_pub0,
    "pubn": w_pubn,
    "latency": w_latency,
    "storm": w_storm,
}


def worker_main(kind: str, params: dict, arr, base: int, results) -> None:
    """Entry point of a forked worker process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise_nofile()
    try:
        import uvloop

        loop = uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is a dependency
        loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    t_cpu = time.process_time()
    try:
        remaining = max(0.1, params["deadline"] - time.monotonic())
        out = loop.run_until_complete(asyncio.wait_for(WORKERS[kind](params, arr, base),
                                                       remaining))
    except TimeoutError:
        out = {"error": "worker deadline reached"}
    except Exception as exc:  # noqa: BLE001 - reported to the coordinator
        out = {"error": f"{type(exc).__name__}: {exc}"}
    if "error" in out:
        arr[base + READY] = -1
    out["cpu_s"] = time.process_time() - t_cpu
    out["pid"] = os.getpid()
    with contextlib.suppress(Exception):
        results.put((base, out))
    with contextlib.suppress(Exception):
        loop.set_exception_handler(lambda _loop, _ctx: None)  # quiet teardown after errors
        loop.close()
