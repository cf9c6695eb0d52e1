"""The compiled mesh entry codec (cluster/_speedups.c) against the Python reference
(cluster/frames.py), entry by entry, on generated ENTRIES frames of every protocol version:
the same entries, the same bytes, and a malformed frame refused the same way.

Why a test of equivalence: ``decode_run`` stops at anything it does not handle and leaves it
to the Python loop, which raises every FrameError, and ``entry_body`` is called only for
messages without properties; a C fast path that decoded or encoded one field differently (an
offset's sign, an epoch on the wrong kind, a group's order) would reach subscribers as a
wrong message, or a peer as a frame it refuses, only in a cluster and only with the C build.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.protocol.properties import Prop
from cluster import frames

pytestmark = pytest.mark.skipif(not frames.SPEEDUPS, reason="cluster._speedups not built")

text = st.text(max_size=12)
entries = st.lists(st.tuples(
    st.integers(1, 2**64 - 1),  # seq
    st.sampled_from([frames.DELIVER, frames.APPEND, frames.RETAIN, frames.RETAIN_SYNC,
                     frames.SHARE, frames.SHARE_ON]),
    text, st.binary(max_size=40), st.integers(0, 2), st.booleans(),
    st.one_of(st.none(), st.just({Prop.CONTENT_TYPE: "json"})),  # properties: Python's part
    st.one_of(st.none(), text),  # origin
    st.one_of(st.none(), text), st.integers(-2**63, 2**63 - 1),  # device, offset
    st.one_of(st.none(), st.integers(0, 2**32 - 1)),  # expiry
    st.one_of(st.none(), st.tuples(text, text)),  # group
    st.integers(0, 2**32 - 1),  # epoch
), max_size=8)


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


def _decode(body: bytes, version: int, compiled: bool, taken: list | None = None
            ) -> list | str:
    """``taken``: gets how many entries the compiled run decoded (before Python went on)."""
    saved = frames.c_decode_run

    def run(*args: object) -> int:
        out = args[-1]
        pos = saved(*args)  # type: ignore[misc]
        if taken is not None:
            taken.append(len(out))  # type: ignore[arg-type]
        return pos

    frames.c_decode_run = run if compiled else None
    try:
        return frames.decode_entries(body, version)
    except frames.FrameError as err:
        return f"FrameError: {err}"
    finally:
        frames.c_decode_run = saved


@settings(max_examples=300, deadline=None)
@given(entries, st.sampled_from([2, 3, 4]))
def test_compiled_decoding_gives_the_python_entries(items: list, version: int) -> None:
    body = _frame_body(items, version)
    taken: list[int] = []
    got = _decode(body, version, compiled=True, taken=taken)
    assert got == _decode(body, version, compiled=False)
    assert isinstance(got, list) and len(got) == len(items)
    # C took every entry up to the first with properties (left to Python): a run that stops
    # early is still correct, but the crossing then costs what it did in Python
    plain = next((i for i, item in enumerate(items) if item[6]), len(items))
    assert taken == [plain]
    for e, item in zip(got, items, strict=True):
        assert type(e) is frames.Entry
        assert (e.seq, e.kind, e.topic, e.payload) == item[:4]
        assert (e.device, e.origin, e.group) == (item[8], item[7], item[11])


@settings(max_examples=300, deadline=None)
@given(entries, st.sampled_from([2, 3, 4]), st.data())
def test_a_malformed_frame_is_refused_as_python_refuses_it(items: list, version: int,
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
    assert _decode(body, version, compiled=True) == _decode(body, version, compiled=False)


@settings(max_examples=300, deadline=None)
@given(text, st.binary(max_size=40), st.integers(0, 2), st.booleans(),
       st.one_of(st.none(), text), st.one_of(st.none(), text),
       st.integers(-2**63, 2**63 - 1), st.one_of(st.none(), st.integers(0, 2**32 - 1)),
       st.one_of(st.none(), st.tuples(text, text)), st.sampled_from(list(range(6))))
def test_compiled_encoding_gives_the_python_bytes(topic: str, payload: bytes, qos: int,
                                                  retain: bool, origin: str | None,
                                                  device: str | None, offset: int,
                                                  expiry: int | None,
                                                  group: tuple[str, str] | None,
                                                  kind: int) -> None:
    flags, tlen, body = frames.entry_body(kind, topic, payload, qos, retain, None, origin,
                                          device, offset, expiry, group)
    assert frames.c_entry_body(topic, payload, qos, retain, origin, device, offset, expiry,
                               group) == ((flags, tlen), body)


def test_a_payload_that_is_not_bytes_is_left_to_python() -> None:
    assert frames.c_entry_body("a/b", bytearray(b"x"), 0, False, None, None, -1, None,
                               None) is None


@pytest.mark.parametrize("package, module, names", [
    ("cluster", "frames", "SPEEDUPS, m.c_entry_items, m.c_plain_run_end"),
    ("broker.protocol", "codec", "SPEEDUPS, m.c_parse_run, m.c_publish_run_end"),
])
def test_an_extension_built_from_older_source_is_set_aside_not_fatal(
        package: str, module: str, names: str) -> None:
    """A ``_speedups`` .so built before a function was added (a checkout updated without
    ``pip install -e .``) lacks it: the codec runs in Python, as without the build, rather
    than the router dying at import with an AttributeError."""
    import subprocess
    import sys
    from pathlib import Path

    code = (f"import sys, types; import {package.split('.')[0]}; "
            f"old = types.ModuleType('{package}._speedups'); "
            "old.setup = old.setup_message = old.decode_run = old.parse_run = "
            "(lambda *a: None); "
            f"sys.modules['{package}._speedups'] = old; "
            f"from {package} import {module} as m; print(m.{names})")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "None", "None"], out.stdout
