"""The receiving router's fast path for plain DELIVERs (issue 25, cheap crossings): the compiled
``decode_plain`` (cluster/_speedups.c) builds broker Messages straight from an ENTRIES frame,
and ``MeshLink._on_entries_frame`` hands whatever follows its run to the Python-checked entry
decoder. Against the reference (every entry decoded by the pure-Python ``decode_entries``,
then ``InboundSequence.fresh`` and ``Message(...)`` as ``Mesh.on_entries`` builds it), on
generated frames of every protocol version, malformed ones included, it must give:

- exactly the leading entries that are plain (DELIVER; no properties, device, expiry or
  group) and fresh (each seq above the last processed one), as Messages equal to the
  reference's in every slot (a slot the C copy left wrong, an origin from the cached previous
  one, a retain flag from the wrong bit, would reach subscribers only in a cluster);
- the last seq it took, for the link's ACK and its dedupe of resends;
- the rest of the frame decoded to the reference's entries, or refused the same way.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.message import Message
from broker.protocol.properties import Prop
from cluster import frames

pytestmark = pytest.mark.skipif(not frames.SPEEDUPS, reason="cluster._speedups not built")

text = st.text(max_size=8)
# mostly plain DELIVERs (long runs), with every kind of entry that ends a run
entries = st.lists(st.tuples(
    st.integers(1, 40),  # seq: small, so frames hold resends and repeats
    st.sampled_from([frames.DELIVER] * 6 + [frames.APPEND, frames.RETAIN, frames.SHARE]),
    st.sampled_from(["a/b", "a/b", "x", "", "é/ü"]), st.binary(max_size=12),
    st.integers(0, 2), st.booleans(),
    st.sampled_from([None] * 6 + [{Prop.CONTENT_TYPE: "json"}]),  # properties
    st.one_of(st.none(), st.sampled_from(["pub-1", "pub-1", "p2"]), text),  # origin
    st.sampled_from([None] * 6 + ["dev-1"]), st.integers(-5, 5),  # device, offset
    st.sampled_from([None] * 6 + [30]),  # expiry
    st.sampled_from([None] * 6 + [("g", "a/#")]),  # group
    st.integers(0, 2**32 - 1),  # epoch
), max_size=10)


def _frame_body(items: list, version: int) -> bytes:
    parts = []
    for (seq, kind, topic, payload, qos, retain, props, origin, device, offset, expiry,
         group, epoch) in items:
        flags, tlen, body = frames.entry_body(kind, topic, payload, qos, retain, props, origin,
                                              device, offset, expiry, group)
        if version >= frames.V_DELIVER_EPOCHS or (version >= frames.V_EPOCHS
                                                  and kind == frames.APPEND):
            parts.append(frames.entry_head_epoch(seq, kind, flags, tlen, epoch))
        else:
            parts.append(frames.entry_head(seq, kind, flags, tlen))
        parts.append(body)
    return frames.encode_entries_parts(parts, len(items))[5:]


def _slots(msg: Message) -> dict:
    return {name: getattr(msg, name) for name in Message.__slots__}


def _reference(body: bytes, version: int, received: int) -> tuple:
    """Pure Python: (messages of the leading plain fresh run, last seq, the rest or why not)."""
    saved = frames.c_decode_run
    frames.c_decode_run = None
    try:
        entries = frames.decode_entries(body, version)
    except frames.FrameError as err:
        return None, None, f"FrameError: {err}"
    finally:
        frames.c_decode_run = saved
    msgs = []
    for e in entries:
        if (e.kind != frames.DELIVER or e.properties is not None or e.device is not None
                or e.expiry is not None or e.group is not None or e.seq <= received):
            break
        received = e.seq
        msgs.append(Message(e.topic, e.payload, e.qos, e.retain, e.properties, None, e.origin))
    return msgs, received, entries[len(msgs):]


def _compiled(body: bytes, version: int, received: int) -> tuple:
    """The fast path as MeshLink._on_entries_frame runs it."""
    try:
        count = frames.entry_count(body)
        msgs: list = []
        pos, last = frames.c_decode_plain(body, 4, count, frames.epochs_mode(version),
                                          received, msgs)
        if len(msgs) < count:
            rest = frames.decode_entries_at(body, pos, count - len(msgs), version)
        elif pos != len(body):
            raise frames.FrameError("trailing bytes after the entries")
        else:
            rest = []
    except frames.FrameError as err:
        return None, None, f"FrameError: {err}"
    return msgs, last, rest


def _same(got: tuple, want: tuple) -> None:
    (g_msgs, g_last, g_rest), (w_msgs, w_last, w_rest) = got, want
    if isinstance(w_rest, str):  # refused: so must the fast path be (maybe after its run)
        assert isinstance(g_rest, str), (got, want)
        return
    assert not isinstance(g_rest, str), (got, want)
    assert [_slots(m) for m in g_msgs] == [_slots(m) for m in w_msgs]
    assert all(type(m) is Message for m in g_msgs)
    assert g_last == w_last
    assert g_rest == w_rest


@settings(max_examples=400, deadline=None)
@given(entries, st.sampled_from([2, 3, 4]), st.integers(0, 20))
def test_plain_deliveries_decode_to_the_messages_python_builds(items: list, version: int,
                                                               received: int) -> None:
    body = _frame_body(items, version)
    want = _reference(body, version, received)
    _same(_compiled(body, version, received), want)
    # the run takes every leading plain fresh entry: a run cut short is still correct, but
    # the crossing then costs what it did before
    assert len(want[0]) == len(_compiled(body, version, received)[0])


@settings(max_examples=400, deadline=None)
@given(entries, st.sampled_from([2, 3, 4]), st.integers(0, 20), st.data())
def test_a_malformed_frame_is_refused_as_python_refuses_it(items: list, version: int,
                                                           received: int,
                                                           data: st.DataObject) -> None:
    body = bytearray(_frame_body(items, version))
    how = data.draw(st.sampled_from(["cut", "flip", "grow"]))
    if how == "cut":
        body = body[:data.draw(st.integers(0, len(body)))]
    elif how == "flip" and len(body) > 4:
        at = data.draw(st.integers(4, len(body) - 1))
        body[at] = data.draw(st.integers(0, 255))
    else:
        body += data.draw(st.binary(min_size=1, max_size=6))
    body = bytes(body)
    got = _compiled(body, version, received)
    want = _reference(body, version, received)
    if isinstance(want[2], str):
        # refused as a whole by Python; the fast path may deliver its leading run first
        # (processed, so never resent), but never a message the reference would not build
        # from the same bytes, and it refuses the frame too
        assert isinstance(got[2], str), (got, want)
        return
    _same(got, want)


def test_a_plain_delivery_is_a_message_like_any_other() -> None:
    """Every slot as Message.__init__ sets it (a slot added later gets its default too)."""
    body = _frame_body([(7, frames.DELIVER, "a/b", b"hi", 1, True, None, "pub", None, -1, None,
                         None, 3)], 4)
    msgs: list = []
    assert frames.c_decode_plain(body, 4, 1, 2, 6, msgs) == (len(body), 7)
    assert _slots(msgs[0]) == _slots(Message("a/b", b"hi", 1, True, None, None, "pub"))
    # a resent seq (at or below the last processed one) is left to the entry decoder
    assert frames.c_decode_plain(body, 4, 1, 2, 7, msgs) == (4, 7) and len(msgs) == 1
