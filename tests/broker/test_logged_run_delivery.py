"""Logged QoS 1 runs at the settle and read-back steps (broker/loggedrun.py ``_settle_run``,
``_route_run``, ``_deliver_run``, ``_send_run``; broker/catchup.py ``pump`` -> ``_deliver_read``)
attacked from the wire: what a subscriber sees must be what the per-message path
(``route``/``deliver``/``_send_inflight``, ``catchup.divert``/``fall_behind``) gives it.

Publishers write many publishes at once (a whole stream, or bursts of it), so the broker reads
runs of up to 64 plain QoS 1 publishes, settles each device's durable batch as runs and reads a
lagging session's records back as runs. Each
subscriber checks what the broker owes it per connection: every message once, in log order;
never more unacknowledged QoS 1 messages than its window (``mqtt.max_inflight``); never a
packet id the subscriber still holds unacknowledged given to another message (including across
the 65535 -> 1 wrap); after a restart (SIGTERM) nothing it acknowledged comes again and nothing
older comes after something newer (its positions, broker/positions.py and sessionstore.py).
"""

from __future__ import annotations

import concurrent.futures
import struct
import time
from collections.abc import Callable

import pytest
from helpers import raw as R
from helpers.authfiles import auth_overrides
from helpers.broker import wait_for
from helpers.clients import unique

pytestmark = pytest.mark.timeout(120)
IDLE_S = 15.0  # a stream that sends nothing for this long has stopped (a hang guard)


def _stream(topic: str, first: int, n: int, *, version: int = 4, pid0: int = 1,
            props_every: int = 0) -> bytes:
    """A publisher's bytes: ``n`` QoS 1 publishes of payloads ``first..first+n-1`` (6 digits)
    with packet ids from ``pid0``; ``props_every``: every so many carry a user property
    (v5: those are not plain, they end a run and their records have headers)."""
    out = []
    for k in range(n):
        i = first + k
        props = ({R.USER_PROPERTY: [("n", str(i))]}
                 if props_every and i % props_every == props_every - 1 else None)
        out.append(R.publish(topic, b"%06d" % i, qos=1, packet_id=pid0 + k, version=version,
                             properties=props))
    return b"".join(out)


def _read_acks(c: R.RawClient, n: int, timeout: float = 60) -> list[int]:
    """The publisher's ``n`` PUBACK packet ids (parsed in place: a long stream's acks are
    many, RawClient.recv copies its buffer once a packet)."""
    got: list[int] = []
    deadline = time.monotonic() + timeout
    for p in _packets(c, deadline, lambda: len(got) >= n):
        if not p:
            continue
        assert p[0] >> 4 == R.PUBACK, p
        got.append(struct.unpack_from("!H", p, 2)[0])
    return got


def _packets(c: R.RawClient, deadline: float, done: Callable[[], bool],
             state: Callable[[], str] = lambda: ""):
    """Whole packets (bytes) from ``c`` as they arrive, until ``done()``; each read's packets are
    yielded before the next read (so a caller can ack a read's worth at once)."""
    buf = c.buf
    idle_until = time.monotonic() + IDLE_S
    while True:
        pos = 0
        while True:
            if len(buf) - pos < 2:
                break
            length = 0
            mult = 1
            i = pos + 1
            while True:
                if i >= len(buf):
                    length = -1
                    break
                byte = buf[i]
                length += (byte & 0x7F) * mult
                mult *= 128
                i += 1
                if not byte & 0x80:
                    break
            if length < 0 or i + length > len(buf):
                break
            yield bytes(buf[pos:i + length])
            pos = i + length
            if done():
                del buf[:pos]
                return
        del buf[:pos]
        if done():
            return
        if pos:
            yield b""  # a read's packets are all out: the caller's chance to ack
        now = time.monotonic()
        remaining = deadline - now
        assert remaining > 0, f"hang guard: the stream stopped ({state()})"
        assert now < idle_until, f"hang guard: nothing for {IDLE_S} s ({state()})"
        c.sock.settimeout(min(remaining, 1.0))
        try:
            chunk = c.sock.recv(262144)
        except TimeoutError:
            continue
        idle_until = time.monotonic() + IDLE_S
        if not chunk:
            raise ConnectionError("the server closed the connection")
        buf += chunk


class Sub:
    """A QoS 1 subscriber's view of one connection. Every PUBLISH is checked as it arrives:
    its packet id is not one this client holds unacknowledged (a collision: two messages in
    flight under one id, [MQTT-2.2.1-3]), and no more than ``window`` are unacknowledged at
    once. It acknowledges at the end of each read (unless ``acking`` is off), except the packet
    ids ``hold`` picks (kept unacknowledged for good)."""

    def __init__(self, c: R.RawClient, window: int, version: int = 4,
                 hold: Callable[[int, int], bool] | None = None) -> None:
        self.c = c
        self.window = window
        self.version = version
        self.hold = hold
        self.unacked: dict[int, bytes] = {}
        self.held: set[int] = set()
        self.got: list[R.Packet] = []  # every PUBLISH, in arrival order
        self.acking = True

    def payloads(self) -> list[int]:
        return [int(p.payload[:6]) for p in self.got]

    def take(self, n: int, timeout: float = 60, delay: float = 0.0) -> list[R.Packet]:
        """Receive until ``n`` PUBLISH in all (``delay``: a pause after each read's acks, a
        slow consumer)."""
        deadline = time.monotonic() + timeout
        for raw in _packets(self.c, deadline, lambda: len(self.got) >= n, self._state):
            if not raw:
                self.ack_all()
                if delay:
                    time.sleep(delay)
                continue
            self._on(R.decode_packet(raw, self.version))
        self.ack_all()
        return self.got

    def _state(self) -> str:
        last = self.payloads()[-3:] if self.got else []
        return (f"{len(self.got)} received, last {last}, unacked "
                f"{sorted(self.unacked)[:10]}")

    def _on(self, p: R.Packet) -> None:
        if p.type != R.PUBLISH:
            assert p.type in (R.PINGRESP, R.SUBACK), p
            return
        if p.qos:
            pid = p.packet_id
            assert pid not in self.unacked, (
                f"packet id {pid} given to {p.payload!r} while {self.unacked[pid]!r} holds it "
                f"unacknowledged (after {len(self.got)} messages)")
            self.unacked[pid] = p.payload
            assert len(self.unacked) <= self.window, (
                f"{len(self.unacked)} unacknowledged, window {self.window}")
            if self.hold is not None and self.hold(pid, len(self.got)):
                self.held.add(pid)
        self.got.append(p)

    def ack_all(self) -> None:
        if not self.acking:
            return
        pids = [pid for pid in self.unacked if pid not in self.held]
        if pids:
            self.c.send(b"".join(R.puback(pid) for pid in pids))
            for pid in pids:
                del self.unacked[pid]

    def drain(self, timeout: float = 30) -> list[R.Packet]:
        """Receive (and ack) until a PINGREQ's answer comes with nothing before it: everything
        the broker had for this client by then."""
        deadline = time.monotonic() + timeout
        while True:
            assert time.monotonic() < deadline, self._state()
            before = len(self.got)
            self.c.send(R.pingreq())
            while True:
                p = self.c.recv(max(0.1, deadline - time.monotonic()))
                if p.type == R.PINGRESP:
                    break
                self._on(p)
            self.ack_all()
            if len(self.got) == before:
                return self.got

    def quiet(self, wait: float = 0.5) -> None:
        """Nothing more arrives: the PINGRESP is the sentinel that the broker read what was
        sent before the PINGREQ (a PUBLISH before it fails ``expect``), then ``wait`` more."""
        self.c.send(R.pingreq())
        self.c.expect(R.PINGRESP)
        self.c.expect_none(wait)


def _in_order_once(got: list[int], expected: list[int], what: str) -> None:
    dups = len(got) - len(set(got))
    back = next((k for k in range(1, len(got)) if got[k] <= got[k - 1]), None)
    assert got == expected, (
        f"{what}: {len(got)} of {len(expected)}, {dups} duplicates, first out of order at "
        f"{back} ({got[back - 1:back + 2] if back else ''}); missing "
        f"{sorted(set(expected) - set(got))[:10]}")


def _subscriber(raw, b, prefix: str, topic: str, *, version: int = 4, qos: int = 1,
                clean: bool = True, client_id: str | None = None, **connect) -> R.RawClient:
    c = raw(b, version=version)
    c.connect(client_id or unique(prefix), clean=clean, **connect)
    c.subscribe(topic, qos)
    return c


def _publisher(raw, b, version: int = 4) -> R.RawClient:
    c = raw(b, version=version)
    c.connect(unique("pub"))
    return c


def _in_thread(fn: Callable[[], object]) -> concurrent.futures.Future:
    """``fn`` run in a thread of its own (a publisher writing and reading its PUBACKs while
    the test reads its subscribers): its future."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    fut = pool.submit(fn)
    pool.shutdown(wait=False)
    return fut


def _publish_all(pub: R.RawClient, data: bytes, n: int) -> concurrent.futures.Future:
    """Write ``data`` (``n`` QoS 1 publishes) and read their ``n`` PUBACKs, in a thread (the
    test reads its subscribers meanwhile): the future's result is the acked packet ids."""
    def go() -> list[int]:
        pub.send(data)
        return _read_acks(pub, n)

    return _in_thread(go)


# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ack_pace", ["batch", "slow"])
def test_a_slow_subscriber_with_a_small_window_gets_a_long_stream_once_in_order(
        start_broker, raw, ack_pace):
    """max_inflight 8, max_queued_messages 16: a v3.1.1 subscriber that acks a read's worth at
    a time (``slow``: and pauses after each) gets 4,000 QoS 1 messages of one publisher write
    once each, in order, never more than 8 unacknowledged, no packet id reused while it holds
    it. One message before the stream gives it a position in the device log, so the stream's
    first run takes the one-write path (as much as the window has room for, the rest queued,
    then the session falls behind); it lags (the read-back runs), then catches up; the
    counters count each once."""
    n = 4000
    b = start_broker(mqtt={"max_inflight": 8, "max_queued_messages": 16})
    topic = f"devices/{unique('slow')}/t"
    sub = Sub(_subscriber(raw, b, "slow", topic), 8)
    other = Sub(_subscriber(raw, b, "second", topic), 8)  # a second session on the same runs
    pub = _publisher(raw, b)
    pub.publish(topic, b"%06d" % 0, 1, packet_id=n + 1)
    sub.take(1)
    other.take(1)
    # (the node's metrics are its routers' counters as last reported: polled)
    wait_for(lambda: b.metric("meshmq_messages_sent_total") == 2, message="the first two sent")
    acks = _publish_all(pub, _stream(topic, 1, n - 1), n - 1)
    sub.take(n, delay=0.002 if ack_pace == "slow" else 0.0)
    other.take(n)
    assert sorted(acks.result(60)) == list(range(1, n))
    _in_order_once(sub.payloads(), list(range(n)), "slow subscriber")
    _in_order_once(other.payloads(), list(range(n)), "second subscriber")
    assert all(p.qos == 1 and not p.dup and not p.retain for p in sub.got)
    sub.quiet()
    other.quiet()
    wait_for(lambda: b.metric("meshmq_sessions_lagging") == 0, timeout=20,
             message="the slow session caught up")
    assert b.metric("meshmq_lag_limit_hits_total") == 0
    wait_for(lambda: b.metric("meshmq_messages_sent_total") == 2 * n, timeout=10,
             message="each message counted once per subscriber")


def test_a_lagging_subscriber_whose_window_has_room_is_still_fed_in_log_order(start_broker,
                                                                               raw):
    """write_buffer_limit 1: a lagging session's read-back stops after one message a pump (its
    connection counts as congested the moment anything is written), so its window has room
    while it is behind on the device. The publisher writes 3,000 messages as 30 runs of 100,
    each after the last was acked (a durable batch each, settled while the subscriber lags):
    each must be left to its cursor (``_deliver_run``'s lag check), not sent into the window's
    room ahead of the older records the cursor has not read yet."""
    n, chunk = 3000, 100
    b = start_broker(mqtt={"max_inflight": 16, "max_queued_messages": 8,
                           "write_buffer_limit": 1})
    topic = f"devices/{unique('room')}/t"
    sub = Sub(_subscriber(raw, b, "room", topic), 16)
    pub = _publisher(raw, b)
    def publish() -> int:
        for first in range(0, n, chunk):
            pub.send(_stream(topic, first, chunk, pid0=first + 1))
            assert sorted(_read_acks(pub, chunk)) == list(range(first + 1, first + chunk + 1))
        return n

    acks = _in_thread(publish)
    sub.take(n, delay=0.001)
    assert acks.result(60) == n
    _in_order_once(sub.payloads(), list(range(n)), "lagging subscriber")
    sub.quiet()


def test_packet_ids_wrap_past_65535_around_ids_still_in_flight(start_broker, raw):
    """A v3.1.1 subscriber keeps 28 messages unacknowledged for good (packet ids 1, 3, 5, 50,
    100, ... 1250) and acks the rest as it reads: past 65,535 deliveries the broker's packet ids
    wrap to 1 and must step over each id still in flight, whichever path allocates it (a run's
    one-write encode, ``_send_run``, allocates most here). 67,000 messages in two publisher
    writes (a publisher's own packet ids may not repeat while unacknowledged)."""
    first, second = 40_000, 27_000
    n = first + second
    held_ids = {1, 3, 5, *range(50, 1300, 50)}
    window = 200
    b = start_broker(mqtt={"max_inflight": window})
    topic = f"devices/{unique('wrap')}/t"
    sub = Sub(_subscriber(raw, b, "wrap", topic), window,
              hold=lambda pid, seen: seen < 60_000 and pid in held_ids)
    pub = _publisher(raw, b)
    def publish() -> int:
        pub.send(_stream(topic, 0, first))
        assert sorted(_read_acks(pub, first)) == list(range(1, first + 1))
        pub.send(_stream(topic, first, second))
        assert sorted(_read_acks(pub, second)) == list(range(1, second + 1))
        return n

    acks = _in_thread(publish)
    sub.take(n, timeout=90)
    assert acks.result(60) == n
    _in_order_once(sub.payloads(), list(range(n)), "wrapping subscriber")
    assert sub.held == held_ids, sorted(held_ids - sub.held)
    pids = [p.packet_id for p in sub.got]
    wrap = pids.index(65535)
    after = pids[wrap + 1:]
    assert after[0] == 2 and not held_ids & set(after), after[:10]  # 1 is still held
    assert max(after) > max(held_ids)  # (every held id was stepped over)
    sub.quiet()
    assert sub.held == set(sub.unacked)  # (acks freed the rest)


def test_a_persistent_session_resumes_across_a_disconnect_and_a_restart(start_broker, raw):
    """A clean-session-false v3.1.1 subscriber (max_inflight 8, max_queued_messages 16):

    1. gets 600 messages live, in 100 writes of 6 (each a run its window has room for: sent in
       one write, its position moved once), and acks them all; the broker restarts (SIGTERM)
       while it is connected: back, it gets none of them again (where it resumes is its
       position in the device log);
    2. reads 600 of a 3,000-message stream, acking all but the last read's, and drops its
       connection; the broker restarts again once every publish is acked: back, it gets what it
       had not acked, then the rest, in log order (a resend with DUP of what it held first),
       nothing it acked, nothing older after newer;
    3. once it acked all of that (read back from the log, as runs), a third restart gives it
       nothing again. (Where it resumes then is its caught-up cursor's offset: a position left
       behind by a read-back run would show only where the log moves to another router.)"""
    b = start_broker(mqtt={"max_inflight": 8, "max_queued_messages": 16})
    device = unique("pers")
    topic = f"devices/{device}/t"
    cid = unique("persub")
    c = _subscriber(raw, b, "persub", topic, clean=False, client_id=cid)
    sub = Sub(c, 8)
    n1 = 600
    pub = _publisher(raw, b)
    for k in range(0, n1, 6):
        pub.send(_stream(topic, k, 6, pid0=k + 1))
        sub.take(k + 6)
    assert sorted(_read_acks(pub, n1)) == list(range(1, n1 + 1))
    _in_order_once(sub.payloads(), list(range(n1)), "first stream")
    sub.quiet()  # (its PUBACKs were read before the PINGREQ)
    b.restart()
    c = raw(b, version=4)
    assert c.connect(cid, clean=False).session_present
    Sub(c, 8).quiet(1.0)

    n2 = 3000
    sub = Sub(c, 8)
    acks = _publish_all(_publisher(raw, b), _stream(topic, n1, n2), n2)
    sub.take(600)
    sub.acking = False  # what comes with the 600th read's end stays unacknowledged
    for raw_pkt in _packets(c, time.monotonic() + 10, lambda: bool(sub.unacked)):
        if raw_pkt:
            sub._on(R.decode_packet(raw_pkt, 4))
    before = sub.payloads()
    acked = set(before) - {int(v) for v in sub.unacked.values()}
    c.abort()
    assert len(acks.result(60)) == n2
    b.restart()
    c = raw(b, version=4)
    assert c.connect(cid, clean=False).session_present
    again = Sub(c, 8)
    rest = sorted(set(range(n1, n1 + n2)) - acked)
    again.take(len(rest))
    got = again.payloads()
    assert not acked & set(got), sorted(acked & set(got))[:10]
    _in_order_once(got, rest, "resumed session")
    # what it held unacked comes first, as resends (DUP); the rest as new messages
    resent = {int(v) for v in sub.unacked.values()}
    dups = [p.dup for p in again.got]
    assert all(p.dup for p in again.got if int(p.payload) in resent), again.got[:10]
    assert dups == sorted(dups, reverse=True), "a resend after a new message"
    again.quiet()
    # 3. all of it acked (the last of it read back from the log as runs): a third restart
    # gives nothing again
    b.restart()
    c = raw(b, version=4)
    assert c.connect(cid, clean=False).session_present
    Sub(c, 8).quiet(1.0)


def test_mixed_subscribers_of_one_run_each_get_their_copy(start_broker, raw):
    """One run, every kind of subscriber ``_route_run`` merges for: a v3.1.1 one (the one-write
    encode), a v5 one with a subscription identifier, a v5 session with two overlapping
    filters of identifiers 11 and 12 (one copy, both identifiers, QoS 1 the best granted), a
    v3.1.1 QoS 0 subscription (QoS 0 copies of the QoS 1 topic), a v5 one whose Maximum
    Packet Size the long payloads exceed, and the v5 publisher itself, subscribed with No Local
    (none of its own). 2,000 messages, every tenth 300 bytes long."""
    n = 2000
    b = start_broker(mqtt={"max_inflight": 64})
    base = f"devices/{unique('mix')}"
    topic = f"{base}/t"

    def payload(i: int) -> bytes:
        return b"%06d" % i + (b"x" * 294 if i % 10 == 9 else b"")

    subs: dict[str, Sub] = {}
    c = _subscriber(raw, b, "v311", topic)
    subs["v311"] = Sub(c, 64)
    c = raw(b, version=5)
    c.connect(unique("v5id"))
    c.subscribe(topic, 1, properties={R.SUBSCRIPTION_IDENTIFIER: 7})
    subs["v5id"] = Sub(c, 64, version=5)
    c = raw(b, version=5)
    c.connect(unique("overlap"))
    c.subscribe([(topic, 0)], properties={R.SUBSCRIPTION_IDENTIFIER: 11})
    c.subscribe([(f"{base}/+", 1)], packet_id=2, properties={R.SUBSCRIPTION_IDENTIFIER: 12})
    subs["overlap"] = Sub(c, 64, version=5)
    c = _subscriber(raw, b, "q0", topic, qos=0)
    subs["q0"] = Sub(c, 64)
    c = raw(b, version=5)
    c.connect(unique("small"), properties={R.MAXIMUM_PACKET_SIZE: 200})
    c.subscribe(topic, 1)
    subs["small"] = Sub(c, 64, version=5)
    pub = raw(b, version=5)
    pub.connect(unique("nlpub"))
    pub.send(R.subscribe(1, [(topic, R.sub_options(1, no_local=True))], version=5))
    pub.expect(R.SUBACK)
    too_large = b.metric("meshmq_messages_dropped_total", reason="too_large")

    pub_acks = _publish_all(pub, b"".join(
        R.publish(topic, payload(i), qos=1, packet_id=i + 1, version=5) for i in range(n)), n)
    small = [i for i in range(n) if i % 10 != 9]
    expected = {"v311": list(range(n)), "v5id": list(range(n)), "overlap": list(range(n)),
                "q0": list(range(n)), "small": small}
    for name, s in subs.items():
        s.take(len(expected[name]))
        _in_order_once([int(p.payload[:6]) for p in s.got], expected[name], name)
        assert [p.payload for p in s.got] == [payload(i) for i in expected[name]], name
    assert sorted(pub_acks.result(60)) == list(range(1, n + 1))
    assert all(p.qos == 1 for name in ("v311", "v5id", "overlap", "small")
               for p in subs[name].got)
    assert all(p.qos == 0 and p.packet_id is None for p in subs["q0"].got)
    ids = {name: {tuple(sorted(p.properties.get(R.SUBSCRIPTION_IDENTIFIER, [])))
                  for p in subs[name].got} for name in ("v5id", "overlap", "small")}
    assert ids == {"v5id": {(7,)}, "overlap": {(11, 12)}, "small": {()}}, ids
    for s in subs.values():
        s.quiet(0.2)
    pub.send(R.pingreq())  # No Local: nothing of its own before the answer
    pub.expect(R.PINGRESP)
    pub.expect_none(0.3)
    wait_for(lambda: b.metric("meshmq_messages_dropped_total", reason="too_large")
             == too_large + n - len(small), message="each too-large copy counted once")


def test_a_lagging_v5_subscriber_reads_back_what_is_not_plain_with_its_properties(
        start_broker, raw):
    """A lagging v5 subscriber (subscription identifier 5) reads back a stream whose every
    seventh message carries a user property (its record has headers): those come with their
    property, the plain ones without, every one with identifier 5, once, in order (the
    read-back runs take plain records only)."""
    n = 3000
    b = start_broker(mqtt={"max_inflight": 8, "max_queued_messages": 8})
    topic = f"devices/{unique('hdr')}/t"
    c = raw(b, version=5)
    c.connect(unique("hdrsub"))
    c.subscribe(topic, 1, properties={R.SUBSCRIPTION_IDENTIFIER: 5})
    sub = Sub(c, 8, version=5)
    acks = _publish_all(_publisher(raw, b, version=5),
                        _stream(topic, 0, n, version=5, props_every=7), n)
    wait_for(lambda: b.metric("meshmq_sessions_lagging") == 1, timeout=20,
             message="the subscriber to fall behind onto the log")
    sub.take(n)
    assert len(acks.result(60)) == n
    _in_order_once(sub.payloads(), list(range(n)), "v5 lagging subscriber")
    for p in sub.got:
        i = int(p.payload)
        props = p.properties
        assert props.get(R.SUBSCRIPTION_IDENTIFIER) in (5, [5]), p
        user = props.get(R.USER_PROPERTY)
        if i % 7 == 6:
            assert user in ([("n", str(i))], ("n", str(i))), p
        else:
            assert user is None, p
    sub.quiet()


ACL = """\
user reader
topic read devices/#
topic deny devices/+/secret

user writer
topic readwrite #
"""
USERS = {"reader": "r-pass", "writer": "w-pass"}


def test_a_run_on_a_topic_the_subscriber_may_not_read_never_reaches_it(start_broker, raw,
                                                                       tmp_path):
    """ACL: ``reader`` subscribes to devices/<d>/# and may not read devices/<d>/secret. Its
    session has a position in the device log (allowed messages first), then a run of 300 on
    the denied topic settles as one (an ACL turns the ingest runs off, not the settle runs):
    the read check runs for each of them (none delivered, each counted), the allowed ones
    before and after arrive once, in order."""
    b = start_broker(**auth_overrides(tmp_path / "auth", USERS, ACL))
    device = unique("acl")
    reader = raw(b, version=4)
    reader.connect(unique("reader"), username="reader", password=USERS["reader"])
    reader.subscribe(f"devices/{device}/#", 1)
    sub = Sub(reader, 32)
    writer = raw(b, version=4)
    writer.connect(unique("writer"), username="writer", password=USERS["writer"])
    denied = b.metric("meshmq_messages_dropped_total", reason="not_authorized")
    open_topic, secret = f"devices/{device}/open", f"devices/{device}/secret"
    writer.send(_stream(open_topic, 0, 5))
    assert sorted(_read_acks(writer, 5)) == [1, 2, 3, 4, 5]
    sub.take(5)
    writer.send(_stream(secret, 5, 300))
    assert sorted(_read_acks(writer, 300)) == list(range(1, 301))
    writer.send(_stream(open_topic, 305, 5))
    assert sorted(_read_acks(writer, 5)) == [1, 2, 3, 4, 5]
    sub.take(10)
    assert [p.topic for p in sub.got] == [open_topic] * 10, {p.topic for p in sub.got}
    _in_order_once(sub.payloads(), [*range(5), *range(305, 310)], "reader")
    sub.quiet(0.2)
    wait_for(lambda: b.metric("meshmq_messages_dropped_total", reason="not_authorized")
             == denied + 300, message="each denied copy counted once")


def test_a_run_with_a_shared_group_member_reaches_every_member_and_the_plain_subscriber(
        start_broker, raw):
    """A run on a topic that a shared group ($share/g/...) also matches goes message by
    message (each share picked per message): the group's two members together get every
    message once, each member's share in order, and a plain subscriber gets them all."""
    n = 1000
    b = start_broker()
    topic = f"devices/{unique('share')}/t"
    members = [Sub(_subscriber(raw, b, f"m{k}", f"$share/g/{topic}"), 32) for k in range(2)]
    plain = Sub(_subscriber(raw, b, "plain", topic), 32)
    acks = _publish_all(_publisher(raw, b), _stream(topic, 0, n), n)
    plain.take(n)
    assert len(acks.result(60)) == n
    _in_order_once(plain.payloads(), list(range(n)), "plain subscriber")
    shares: list[int] = []
    for m in members:
        m.drain()
        m.quiet(0.3)
        shares += m.payloads()
        assert m.payloads() == sorted(m.payloads())
    assert sorted(shares) == list(range(n)), f"{len(shares)} shares of {n}"


def test_an_offset_subscription_reads_history_then_the_runs_once(start_broker, raw):
    """An offset subscription (user property offset=earliest) on a device with 3,000
    messages of history, its window (8) full of history while a 2,000-message run is stored and
    settled: the live run is left to its replay cursor (``accept_live``), so it gets all 5,000
    once, in log order."""
    history, live = 3000, 2000
    b = start_broker(mqtt={"max_inflight": 8, "max_queued_messages": 8})
    topic = f"devices/{unique('replay')}/t"
    pub = _publisher(raw, b)
    pub.send(_stream(topic, 0, history))
    assert len(_read_acks(pub, history)) == history
    c = raw(b, version=5)
    c.connect(unique("replayer"))
    ack = c.subscribe(topic, 1, properties={R.USER_PROPERTY: [("offset", "earliest")]})
    assert ack.reason_codes == [1], ack
    sub = Sub(c, 8, version=5)
    pub.send(_stream(topic, history, live))
    assert len(_read_acks(pub, live)) == live
    sub.take(history + live)
    _in_order_once(sub.payloads(), list(range(history + live)), "offset subscriber")
    sub.quiet()
