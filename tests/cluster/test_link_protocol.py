"""The mesh link protocol without sockets: frames, the handshake, the inbound sequence.

Sans-I/O like broker/protocol: bytes in, frames out, so every refusal and the resend/dedupe
bookkeeping are checked directly; the process-level tests (test_link_faults.py) show the same
on real links.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.protocol.properties import Prop
from cluster import frames, handshake
from cluster.handshake import AcceptorHandshake, DialerHandshake, HandshakeRefused
from cluster.link import InboundSequence

SECRET = b"0123456789abcdef-secret"


def _pair(dialer_secret: bytes = SECRET, acceptor_secret: bytes = SECRET,
          dialer_cluster: str = "c", acceptor_cluster: str = "c",
          dialer: str = "a/0", acceptor: str = "b/0", known_to_acceptor: set | None = None,
          resume: dict | None = None):
    resume = resume or {}
    d = DialerHandshake(dialer_cluster, dialer, dialer_secret, b"D" * 16, {acceptor},
                        lambda peer, inc: resume.get(peer, 0), peer=acceptor)
    a = AcceptorHandshake(acceptor_cluster, acceptor, acceptor_secret, b"A" * 16,
                          known_to_acceptor if known_to_acceptor is not None else {dialer},
                          lambda peer, inc: resume.get(peer, 0))
    return d, a


def _run(d: DialerHandshake, a: AcceptorHandshake):
    """Drive both sides over one in-memory byte stream each way; returns both verdicts."""
    to_a = frames.FrameReader()
    to_d = frames.FrameReader()
    wire_a = d.start()
    result_d = result_a = None
    for _ in range(4):
        for ftype, body in to_a.feed(wire_a):
            out, est = a.on_frame(ftype, body)
            result_a = est or result_a
            for ftype2, body2 in to_d.feed(out):
                out2, est2 = d.on_frame(ftype2, body2)
                result_d = est2 or result_d
                wire_a = out2
        if result_a and result_d:
            break
    return result_d, result_a


def test_handshake_establishes_both_sides_with_resume_points() -> None:
    d, a = _pair(resume={"a/0": 7, "b/0": 3})
    est_d, est_a = _run(d, a)
    assert est_d.peer == "b/0" and est_a.peer == "a/0"
    assert est_d.peer_incarnation == b"A" * 16 and est_a.peer_incarnation == b"D" * 16
    assert est_a.resume_from == 3  # the dialer processed 3 of the acceptor's entries
    assert est_d.resume_from == 7


@pytest.mark.parametrize("case,where,words", [
    ("secret", "acceptor", "cluster.secret"),
    ("cluster", "acceptor", "cluster.name differs"),
    ("unknown", "acceptor", "not in this node's [[cluster.nodes]]"),
    ("direction", "acceptor", "the lower id dials"),
])
def test_every_mismatch_is_refused_with_the_key_to_fix(case: str, where: str,
                                                       words: str) -> None:
    kwargs: dict = {}
    if case == "secret":
        kwargs = {"dialer_secret": b"another-secret-0123456"}
    elif case == "cluster":
        kwargs = {"dialer_cluster": "other"}
    elif case == "unknown":
        kwargs = {"known_to_acceptor": {"z/0"}}
    elif case == "direction":
        kwargs = {"dialer": "c/0", "acceptor": "b/0"}
    d, a = _pair(**kwargs)
    with pytest.raises(HandshakeRefused) as err:
        _run(d, a)
    assert words in err.value.why


def test_a_dialer_refuses_an_acceptor_that_proves_another_secret() -> None:
    d, a = _pair()
    hello = frames.FrameReader().feed(d.start())[0]
    out, _ = a.on_frame(*hello)
    ftype, body = frames.FrameReader().feed(out)[0]
    forged = bytearray(body)
    forged[-1] ^= 1  # the acceptor's proof, one bit off
    with pytest.raises(HandshakeRefused) as err:
        d.on_frame(ftype, bytes(forged))
    assert "different cluster secret" in err.value.why


def test_entries_round_trip_with_properties_and_positions() -> None:
    props = {Prop.CONTENT_TYPE: "json", Prop.USER_PROPERTY: [("k", "v"), ("k", "w")],
             Prop.CORRELATION_DATA: b"\x00\x01"}
    flags, tlen, body = frames.entry_body(frames.APPEND, "devices/d1/t", b"payload", 2, True,
                                          props, "client-1", "d1", 41, 30)
    flags2, tlen2, body2 = frames.entry_body(frames.DELIVER, "a/b", b"", 0, False, None, None,
                                             None, -1, None)
    data = frames.encode_entries([frames.entry_bytes(5, frames.APPEND, flags, tlen, body),
                                  frames.entry_bytes(6, frames.DELIVER, flags2, tlen2, body2)])
    [(ftype, frame_body)] = frames.FrameReader().feed(data[:7] + data[7:])
    assert ftype == frames.ENTRIES
    e1, e2 = frames.decode_entries(frame_body)
    assert (e1.seq, e1.kind, e1.topic, e1.payload, e1.qos, e1.retain) == (
        5, frames.APPEND, "devices/d1/t", b"payload", 2, True)
    assert e1.properties == props and e1.origin == "client-1"
    assert (e1.device, e1.offset, e1.expiry) == ("d1", 41, 30)
    assert (e2.seq, e2.topic, e2.payload, e2.qos, e2.properties, e2.device) == (
        6, "a/b", b"", 0, None, None)


@given(st.lists(st.binary(max_size=300), max_size=20), st.integers(1, 50))
def test_the_frame_reader_reassembles_any_split(bodies: list[bytes], chunk: int) -> None:
    stream = b"".join(frames.frame(frames.PING, b) for b in bodies)
    reader = frames.FrameReader()
    got = []
    for i in range(0, len(stream), chunk):
        got.extend(reader.feed(stream[i:i + chunk]))
    assert got == [(frames.PING, b) for b in bodies]


def test_a_frame_claiming_too_much_is_a_protocol_error() -> None:
    with pytest.raises(frames.FrameError):
        frames.FrameReader(max_frame=1000).feed(b"\x00\x10\x00\x00\x0a")
    with pytest.raises(frames.FrameError):
        frames.decode_entries(b"\x00\x00\x00\x02" + b"\x00" * 9)


def test_inbound_sequence_holds_the_ack_for_appends_and_drops_their_resends() -> None:
    seq = InboundSequence()
    seq.reset(b"inc-1")
    assert all(seq.fresh(i) for i in (1, 2, 3))
    slot = seq.hold(4)
    assert seq.fresh(4)
    assert seq.fresh(5)
    assert seq.ack_point() == 3  # 4 is appended, not yet durable: the ACK stops below it
    assert seq.resume_point(b"inc-1") == 3
    # the link drops; the peer resends 4 and 5 (above the resume point): both are dropped
    # as already processed, so the APPEND is not stored twice
    assert not seq.fresh(4) and not seq.fresh(5)
    seq.release(slot)
    assert seq.ack_point() == 5
    assert seq.resume_point(b"inc-2") == 0  # another incarnation processed nothing of ours
    seq.reset(b"inc-2")
    assert seq.fresh(1)


def test_an_acceptor_refuses_a_dialer_that_cannot_prove_the_secret() -> None:
    """A dialer without the secret (it cannot compute the proof) never gets READY."""
    d, a = _pair()
    hello = frames.FrameReader().feed(d.start())[0]
    a.on_frame(*hello)
    [(ftype, body)] = frames.FrameReader().feed(handshake.encode_auth(b"\x00" * 32, 0))
    with pytest.raises(HandshakeRefused) as err:
        a.on_frame(ftype, body)
    assert "failed the secret check" in err.value.why


def test_fetch_and_records_frames_carry_stored_bytes_unchanged() -> None:
    """Offset replay at a non-owner (and the follower fetch of the replication issue): "read D
    from N", answered with the record bytes as the log stores them (not decoded and encoded
    again)."""
    from commitlog.record import decode_batch, encode_batch, make_record

    recs = [make_record(i, 1_000 + i, "d1", "devices/d1/t", 1, [("k", b"v")], b"p%d" % i)
            for i in range(3)]
    stored = encode_batch(recs)
    for version in (2, 3):  # the bytes ride unchanged at every version
        fetch = frames.Fetch(7, "d1", 0, 100)
        [(ftype, body)] = frames.FrameReader().feed(frames.encode_fetch(fetch, version))
        assert ftype == frames.FETCH and frames.decode_fetch(body, version) == fetch
        [(ftype, body)] = frames.FrameReader().feed(
            frames.encode_records(frames.Records(7, 0, 0, 3, 3, stored), version))
        r = frames.decode_records(body, version)
        assert (r.request, r.status, r.log_start, r.high_watermark, r.next_offset) == (
            7, 0, 0, 3, 3)
        assert r.data == stored
        assert [x.payload for x in decode_batch(r.data, 0)] == [b"p0", b"p1", b"p2"]


def test_resolve_frames_round_trip_a_refusal_and_an_offset() -> None:
    [(ftype, body)] = frames.FrameReader().feed(
        frames.encode_resolve(9, "d1", "@1700000000000", "earliest"))
    assert ftype == frames.RESOLVE
    assert frames.decode_resolve(body) == (9, "d1", "@1700000000000", "earliest")
    for offset, why in ((0, ""), (42, ""), (None, "offset 9 of 'd1' is outside the log")):
        [(ftype, body)] = frames.FrameReader().feed(frames.encode_resolved(9, offset, why))
        assert ftype == frames.RESOLVED and frames.decode_resolved(body) == (9, offset, why)
    with pytest.raises(frames.FrameError):
        frames.decode_resolved(b"\x00" * 5)


def test_a_peer_of_mesh_protocol_1_is_refused() -> None:
    """review3: SHARE_ON (a share handed on) and the ':src' record header came in with the
    mesh protocol still at 1. A build of protocol 1 acknowledges a SHARE_ON it does not know
    and applies nothing (the share is lost, uncounted), and passes ':src' to its MQTT 5
    subscribers as a user property when it reads a newer owner's log: such a peer must be
    refused at the handshake, naming the versions, not linked."""
    d, a = _pair()
    # a router built before SHARE_ON and ':src' (it speaks 1 and nothing else)
    d.me = dataclasses.replace(d.me, version=1, top=0)
    with pytest.raises(HandshakeRefused) as err:
        _run(d, a)
    assert "speaks mesh protocol 1" in err.value.why
