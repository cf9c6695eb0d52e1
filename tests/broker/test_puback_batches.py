"""The acks of a durable batch (issue 25): a group commit's QoS 1 PUBACKs to one publisher are
written together (``broker/pubacks.py``, ``IngestRoom._on_durable``), and must still be one per
PUBLISH, each with its packet identifier, in the order the PUBLISHes were sent
([MQTT-4.6.0-2]); a QoS 2 PUBREC among them keeps its place; two publishers of one device in
one batch each get all of theirs.

Pipelined publishes sent in one write land in few batches, so the acks of each batch come as
runs; the packet ids are shuffled over the whole 16-bit range (a byte-order slip or a shifted
run shows as a wrong id, not only as a missing ack).
"""

import random

import pytest
from helpers import raw as R
from helpers.clients import unique

pytestmark = pytest.mark.timeout(120)

N = 400
ACK_WAIT_S = 30.0  # per ack: generous for a loaded 2-core box (each batch waits for an fsync)


def _acks(client: R.RawClient, count: int) -> list[tuple[int, int]]:
    """The next ``count`` acks as (packet type, packet id), in arrival order."""
    out = []
    while len(out) < count:
        try:
            pkt = client.recv(ACK_WAIT_S)
        except TimeoutError:
            raise AssertionError(f"{len(out)} of {count} acks arrived; the next did not come "
                                 f"within {ACK_WAIT_S:.0f} s (last: {out[-3:]})") from None
        assert pkt.type in (R.PUBACK, R.PUBREC), f"unexpected packet {pkt!r}"
        assert pkt.raw[1] == 2, f"an ack of the short form expected (40 02 <pid>): {pkt!r}"
        out.append((pkt.type, pkt.packet_id))
    return out


@pytest.mark.parametrize("version", [4, 5], ids=["v311", "v5"])
def test_pipelined_acks_one_per_publish_in_order(broker, raw, version):
    """400 QoS 1 publishes of one device in one write, with a QoS 2 one in the middle: 400
    PUBACKs and one PUBREC, each carrying its PUBLISH's id, in exactly the publish order."""
    device = unique("acks")
    topic = f"devices/{device}/t"
    sub = raw(broker, version=version)
    sub.connect(unique("acks-sub"))
    sub.subscribe(f"devices/{device}/#", 0)
    pub = raw(broker, version=version)
    pub.connect(unique("acks-pub"))
    rng = random.Random(25)
    ids = rng.sample(range(1, 65536), N + 1)
    ids[:3] = [0x00FF, 0xFF00, 0x0102]  # both bytes matter, either order
    sent = []
    data = bytearray()
    for i, pid in enumerate(ids):
        qos = 2 if i == N // 2 else 1
        data += R.publish(topic, f"m{i}".encode(), qos=qos, packet_id=pid, version=version)
        sent.append((R.PUBREC if qos == 2 else R.PUBACK, pid))
    pub.send(bytes(data))
    got = _acks(pub, len(sent))
    assert got == sent, next(f"ack {i} is {g}, expected {s} (publish order)"
                             for i, (g, s) in enumerate(zip(got, sent, strict=True)) if g != s)
    pub.send(R.pubrel(ids[N // 2]))
    assert pub.expect(R.PUBCOMP, 30).packet_id == ids[N // 2]
    # the subscriber got them all, in order: the routing beside the acks is unchanged
    payloads = [sub.expect(R.PUBLISH, 30).payload for _ in sent]
    assert payloads == [f"m{i}".encode() for i in range(len(sent))]
    pub.expect_none(0.3)


@pytest.mark.parametrize("topics", [1, 2], ids=["run", "two-topics"])
def test_two_publishers_of_one_device_each_get_all_their_acks(broker, raw, topics):
    """Two publishers writing the same device's topic in bursts side by side (their bursts
    share group-commit batches): each gets every one of its acks, in its own order. ``run``:
    one topic, so the batches settle as runs (broker/loggedrun.py ``_settle_run``);
    ``two-topics``: the device's two topics alternate, so each message settles on its own
    (``IngestRoom._on_durable``'s per-message loop)."""
    device = unique('acks2')
    names = [f"devices/{device}/t", f"devices/{device}/u"][:topics]
    pubs = [raw(broker, version=4) for _ in range(2)]
    for i, p in enumerate(pubs):
        p.connect(unique(f"acks2-{i}"))
    expected: list[list[tuple[int, int]]] = [[], []]
    next_id = [1, 30001]
    for _burst in range(20):
        for i, p in enumerate(pubs):
            data = bytearray()
            for k in range(20):
                pid = next_id[i]
                next_id[i] += 1
                data += R.publish(names[k % topics], b"x", qos=1, packet_id=pid)
                expected[i].append((R.PUBACK, pid))
            p.send(bytes(data))
    for i, p in enumerate(pubs):
        assert _acks(p, len(expected[i])) == expected[i], f"publisher {i}"
        p.expect_none(0.3)


def test_a_puback_for_a_qos2_delivery_does_not_end_it(broker, raw):
    """The router's dispatch loop settles a subscriber's PUBACK inline (issue 25): a PUBACK
    naming a QoS 2 delivery's packet id must leave that flow in flight (only a PUBREC moves
    it), so the PUBREC that follows still gets a PUBREL with reason 0, not 0x92 (packet
    identifier not found); and the message is not counted as acknowledged twice."""
    topic = f"devices/{unique('q2ack')}/t"
    sub = raw(broker, version=5)
    sub.connect(unique("q2ack-sub"))
    sub.subscribe(topic, 2)
    pub = raw(broker, version=5)
    pub.connect(unique("q2ack-pub"))
    pub.send(R.publish(topic, b"two", qos=2, packet_id=5, version=5))
    assert pub.expect(R.PUBREC, 30).packet_id == 5
    msg = sub.expect(R.PUBLISH, 30)
    assert msg.qos == 2
    sub.send(R.puback(msg.packet_id))  # the wrong ack for a QoS 2 flow
    sub.send(R.pubrec(msg.packet_id))
    rel = sub.expect(R.PUBREL, 30)
    assert (rel.packet_id, rel.reason_code or 0) == (msg.packet_id, 0), rel
    sub.send(R.pubcomp(msg.packet_id))
    sub.expect_none(0.3)
