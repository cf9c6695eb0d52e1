"""The compiled makers of Message and Delivery, and the whole-packet QoS 1/2 encoder
(broker/protocol/_speedups.c ``slot_maker`` and ``publish_packet_pid``), against the Python
they stand in for.

A maker skips the class's __init__: an object it makes must equal the class's own, slot for
slot and type for type, for any arguments, and a class it cannot copy safely (a mutable
default, a __dict__, an __init__ that does more than store) must be left to its __init__.
The encoder must give the bytes the Python path writes (``Message.parts`` head + packet id +
tail). Skipped when the extension is not built.
"""

from __future__ import annotations

import gc
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker import message as M
from broker.message import Delivery, Message, new_delivery, new_message
from broker.protocol import codec
from broker.protocol.codec import publish_parts

pytestmark = pytest.mark.skipif(not codec.SPEEDUPS, reason="broker.protocol._speedups not built")
HYP = settings(max_examples=300, deadline=None)

scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 70000), st.text(max_size=8),
                    st.binary(max_size=8), st.floats(allow_nan=False))


def slots(obj: object) -> list[tuple[str, type, object]]:
    return [(n, type(getattr(obj, n)), getattr(obj, n)) for n in type(obj).__slots__]


def test_the_shipped_classes_are_made_by_the_compiled_makers() -> None:
    # the guard in broker/message.py falls back to the class silently: a maker that stopped
    # matching would cost the hot path its speed, never its correctness, so say it here
    assert new_message is not Message and new_delivery is not Delivery


@HYP
@given(topic=st.text(max_size=20), payload=st.binary(max_size=20), qos=st.integers(0, 2),
       retain=st.booleans(), props=st.one_of(st.none(), st.dictionaries(st.integers(1, 40),
                                                                        st.integers())),
       expiry=st.one_of(st.none(), st.floats(0, 1e6)), origin=st.one_of(st.none(), st.text()))
def test_a_made_message_is_the_class_s_own_slot_for_slot(topic, payload, qos, retain, props,
                                                         expiry, origin) -> None:
    args = (topic, payload, qos, retain, props, expiry, origin)
    ours, theirs = new_message(*args), Message(*args)
    assert slots(ours) == slots(theirs)
    ours.device, ours.offset = "d", 7  # its own slots: nothing shared with the template
    assert M._TEMPLATE.device is None and M._TEMPLATE.offset == -1


@HYP
@given(qos=st.integers(0, 2), retain=st.booleans(),
       sub_ids=st.one_of(st.none(), st.tuples(st.integers(1, 9))),
       rest=st.lists(scalars, max_size=2))
def test_a_made_delivery_is_the_class_s_own_slot_for_slot(qos, retain, sub_ids, rest) -> None:
    msg = Message("t", b"p", 1, False, None, None, None)
    args = (msg, qos, retain, sub_ids, *rest)
    ours, theirs = new_delivery(*args), Delivery(*args)
    assert slots(ours) == slots(theirs)
    assert ours.msg is msg
    ours.pid, ours.state = 9, Delivery.SENT  # mutable per object, as the class's
    assert new_delivery(msg, 1, False, None).pid == 0


def test_the_makers_take_the_class_s_argument_counts_only() -> None:
    with pytest.raises(TypeError):
        new_delivery(Message("t", b"", 0, False, None, None, None), 1, False)  # 3 of 4..6
    with pytest.raises(TypeError):
        new_message("t", b"", 0, False, None, None, None, "extra")
    with pytest.raises(TypeError):
        new_message("t", b"", 0, False, None, None, origin="c")  # positional only


class Grows:
    """An __init__ that does more than store its arguments: a maker would skip that."""

    __slots__ = ("a", "b")

    def __init__(self, a: int, b: int = 0) -> None:
        self.a = a
        self.b = a + b


class Mutable:
    __slots__ = ("a", "seen")

    def __init__(self, a: int) -> None:
        self.a = a
        self.seen: list[int] = []  # shared by every instance if the maker copied it


class Plain:
    def __init__(self, a: int) -> None:
        self.a = a


def test_a_class_the_maker_cannot_copy_is_left_to_its_init() -> None:
    assert M._maker(Grows, Grows(0), ("a", "b"), 1, (2, 3)) is Grows
    make = codec.c_slot_maker
    with pytest.raises(TypeError, match="immutable scalar"):
        make(Mutable, Mutable(0), ("a",), 1)
    assert M._maker(Mutable, Mutable(0), ("a",), 1, (1,)) is Mutable
    with pytest.raises(TypeError, match="__slots__ only"):
        make(Plain, Plain(0), ("a",), 1)
    with pytest.raises(TypeError, match="not in __slots__"):
        make(Grows, Grows(0), ("c",), 1)


def test_made_objects_are_freed_with_everything_they_hold() -> None:
    msg = Message("t", b"p", 1, False, None, None, None)
    for _ in range(1000):  # warm
        new_delivery(msg, 1, False, None)
        new_message("t", b"p", 1, False, None, None, "c")
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(50_000):
            d = new_delivery(new_message("t", b"p" * 100, 1, False, None, None, "c"), 1,
                             False, None)
            d.msg.device = "x"
        del d
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 64 * 1024, f"{grown} bytes kept after 50,000 made and dropped"


@HYP
@given(topic=st.text(max_size=40), payload=st.binary(max_size=300), qos=st.integers(1, 2),
       retain=st.booleans(), pid=st.integers(1, 65535))
def test_the_whole_packet_encoder_writes_what_parts_and_the_pid_write(topic, payload, qos,
                                                                      retain, pid) -> None:
    head, tail = publish_parts(topic, payload, qos, retain, False, None, 4)
    b0 = 0x30 | (qos << 1) | (1 if retain else 0)
    assert codec.c_publish_packet_pid(topic, payload, b0, pid) == (
        head + pid.to_bytes(2, "big") + tail)
    assert codec.c_publish_packet_pid(topic, memoryview(payload), b0, pid) == (
        head + pid.to_bytes(2, "big") + tail)


def test_the_whole_packet_encoder_refuses_what_has_no_packet_id() -> None:
    enc = codec.c_publish_packet_pid
    for b0, pid in ((0x30, 1), (0x32, 0), (0x32, 65536)):
        with pytest.raises(ValueError):
            enc("t", b"", b0, pid)
    with pytest.raises(ValueError, match="65535"):
        enc("t" * 70000, b"", 0x32, 1)


def test_made_objects_keep_no_reference_to_what_they_no_longer_hold() -> None:
    """review11: reference counts, not only memory (a reference kept on a shared template
    value, None or "" or 0, grows no memory but is a leak of the maker's bookkeeping; one
    dropped frees an argument still in use). After 100,000 made and dropped, the template's
    values, the arguments and the classes have the references they had."""
    import sys

    topic, payload, origin = "t/r11-" + "x" * 20, b"p" * 50, "client-r11"
    watched = [topic, payload, origin, Message, Delivery,
               *(getattr(M._TEMPLATE, n) for n in Message.__slots__ if hasattr(M._TEMPLATE, n))]
    gc.collect()
    before = [sys.getrefcount(o) for o in watched]
    for _ in range(100_000):
        d = new_delivery(new_message(topic, payload, 1, False, None, None, origin), 1, False,
                         None)
    del d
    gc.collect()
    after = [sys.getrefcount(o) for o in watched]
    moved = [(repr(o)[:30], a - b) for o, a, b in zip(watched, after, before, strict=True)
             if abs(a - b) > 100]
    assert not moved, f"references gained or lost over 100,000 made objects: {moved}"


def test_a_made_object_in_a_reference_cycle_is_collected() -> None:
    """review11: the GC sees a made object's slots (it is tracked and its type traverses
    them), so a cycle through one is collected, not kept for ever."""
    import weakref

    class Box:
        pass

    for make in (lambda b: new_message("t", b"p", 1, False, b, None, "c"),
                 lambda b: new_delivery(new_message("t", b"p", 1, False, None, None, "c"),
                                        1, False, None, b)):
        box = Box()
        obj = make(box)
        box.back = obj  # box -> obj -> box
        assert gc.is_tracked(obj) and box in gc.get_referents(obj)
        gone = weakref.ref(box)
        del box, obj
        gc.collect()
        assert gone() is None, "a cycle through a made object was never collected"
