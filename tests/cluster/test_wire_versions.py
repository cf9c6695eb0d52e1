"""Mesh protocol versions and epochs on the wire, without sockets (issue 26, Wire).

The handshake negotiates the highest version both routers speak (each capped by
``cluster.protocol_version``); a router capped at 2 sends byte for byte what a version-2 build
sends, and the version-2 build itself (the handshake and frames of a052f44, loaded from git) links
with a new router either way round. Every field version 3 adds round-trips, and a version-2 link
never carries one. Fencing (``cluster/fencing.py``) refuses an APPEND for a log the receiver does
not lead, or at an epoch that is not the current one. The process-level twins are in
test_wire_mixed.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import importlib.util
import subprocess
import sys
import types
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster import frames, handshake
from cluster.fencing import append_refusal
from cluster.handshake import AcceptorHandshake, DialerHandshake, HandshakeRefused
from cluster.placement import Placement


def _decode_entries(body: bytes, version: int) -> list[frames.Entry]:
    """The entries as the Python decoder reads them, which must be what the compiled one
    (cluster/_speedups.c, when built) reads too: both are held to every wire rule here."""
    compiled = frames.c_decode_run
    frames.c_decode_run = None
    try:
        out = frames.decode_entries(body, version)
    finally:
        frames.c_decode_run = compiled
    if compiled is not None:
        assert frames.decode_entries(body, version) == out
    return out


SECRET = b"0123456789abcdef-secret"
REPO = Path(__file__).resolve().parents[2]
BASE = "a052f44"  # main before epochs: mesh protocol 2, versions must be equal


def _sides(dialer_cap: int = frames.VERSION, acceptor_cap: int = frames.VERSION,
           dialer_cls: type = DialerHandshake, acceptor_cls: type = AcceptorHandshake,
           caps: bool = True) -> tuple:
    extra_d = (dialer_cap,) if caps and dialer_cls is DialerHandshake else ()
    extra_a = (acceptor_cap,) if caps and acceptor_cls is AcceptorHandshake else ()
    d = dialer_cls("c", "a/0", SECRET, b"D" * 16, {"b/0"}, lambda p, i: 0, *extra_d,
                   peer="b/0")
    a = acceptor_cls("c", "b/0", SECRET, b"A" * 16, {"a/0"}, lambda p, i: 0, *extra_a)
    return d, a


def _run(d, a, tamper=None) -> tuple:
    """Both sides over in-memory streams; ``tamper(ftype, body) -> body`` edits what the
    dialer sends (a middlebox). Returns both verdicts (None where not established)."""
    to_a, to_d = frames.FrameReader(), frames.FrameReader()
    wire = d.start()
    est_d = est_a = None
    for _ in range(4):
        for ftype, body in to_a.feed(wire):
            if tamper is not None:
                body = tamper(ftype, body)
            out, est = a.on_frame(ftype, body)
            est_a = est or est_a
            for ftype2, body2 in to_d.feed(out):
                wire, est2 = d.on_frame(ftype2, body2)
                est_d = est2 or est_d
        if est_a and est_d:
            break
    return est_d, est_a


@pytest.mark.parametrize("dialer_cap,acceptor_cap", [(2, 2), (2, 3), (3, 2), (3, 3)])
def test_the_handshake_settles_on_the_highest_version_both_speak(dialer_cap: int,
                                                                 acceptor_cap: int) -> None:
    est_d, est_a = _run(*_sides(dialer_cap, acceptor_cap))
    want = min(dialer_cap, acceptor_cap)
    assert est_d is not None and est_a is not None
    assert (est_d.version, est_a.version) == (want, want)


def test_a_router_capped_at_2_speaks_exactly_version_2() -> None:
    """Its HELLO ends at the incarnation (what a version-2 build sends), and the CHALLENGE it
    gets back from a new acceptor is a version-2 CHALLENGE: version 2, the version-2 proof."""
    d, a = _sides(dialer_cap=2)
    [(ftype, hello)] = frames.FrameReader().feed(d.start())
    assert ftype == frames.HELLO
    assert hello == (b"\x00\x02" + b"\x00\x01c" + b"\x00\x03a/0" + d.me.nonce + b"D" * 16)
    out, _ = a.on_frame(ftype, hello)
    [(ftype, challenge)] = frames.FrameReader().feed(out)
    peer, mac = handshake.decode_hello(challenge)
    assert peer.version == 2 and len(mac) == 32
    v2 = b"|".join((b"acceptor", b"c", b"a/0", b"b/0", d.me.nonce, peer.nonce))
    assert mac == hmac.new(SECRET, v2, hashlib.sha256).digest()


def test_a_new_dialer_says_its_highest_version_after_what_version_2_reads() -> None:
    d, _ = _sides()
    [(_, hello)] = frames.FrameReader().feed(d.start())
    fields, rest = handshake.decode_hello(hello)  # how a version-2 build reads it
    assert fields.version == 2 and rest == b"\x00\x04"
    assert handshake.decode_hello_frame(hello).highest == 4
    # a HELLO may grow at its end: what follows the fields a reader knows is ignored
    assert handshake.decode_hello_frame(hello + b"more").highest == 4


def test_a_middlebox_cannot_talk_two_new_routers_down_to_another_version() -> None:
    """From version 3 the proofs cover the dialer's range and the choice: a HELLO whose highest
    version was changed on the way fails the secret check, at the dialer (the acceptor's proof
    covers what it received)."""
    def lower(ftype: int, body: bytes) -> bytes:
        return body[:-2] + b"\x00\x03" if ftype == frames.HELLO else body

    with pytest.raises(HandshakeRefused) as err:
        _run(*_sides(), tamper=lower)
    assert "different cluster secret" in err.value.why


def test_no_common_version_is_refused_naming_both_and_the_key() -> None:
    d, a = _sides()
    d.me = dataclasses.replace(d.me, version=5, top=6)  # a future build that dropped 2 to 4
    with pytest.raises(HandshakeRefused) as err:
        _run(d, a)
    assert "speaks mesh protocol 5-6, this router 2-4" in err.value.why
    assert "cluster.protocol_version" in err.value.why
    d, a = _sides(dialer_cap=2)
    a.me = dataclasses.replace(a.me, version=3, top=0)  # an acceptor that speaks only 3
    with pytest.raises(HandshakeRefused) as err:
        _run(d, a)
    assert "speaks mesh protocol 2, this router 3" in err.value.why


def test_a_dialer_refuses_a_version_it_did_not_offer() -> None:
    d, a = _sides(dialer_cap=2)
    [(ftype, hello)] = frames.FrameReader().feed(d.start())
    out, _ = a.on_frame(ftype, hello + b"\x00\x03")  # the acceptor is told 2-3
    [(ftype, challenge)] = frames.FrameReader().feed(out)
    assert handshake.decode_hello(challenge)[0].version == 3
    with pytest.raises(HandshakeRefused) as err:
        d.on_frame(ftype, challenge)
    assert "speaks mesh protocol 3, this router 2" in err.value.why


# -- the version-2 build itself ------------------------------------------------------------
def _old_cluster() -> types.ModuleType:
    """cluster/frames.py, settings.py and handshake.py of the base commit, as a package
    ``oldmesh`` (its imports of ``cluster`` pointed at itself)."""
    if not (REPO / ".git").exists():
        pytest.skip("no .git in this checkout: the version-2 build cannot be loaded from git")
    try:
        texts = {name: subprocess.run(["git", "-C", str(REPO), "show",
                                       f"{BASE}:cluster/{name}.py"], check=True,
                                      capture_output=True, text=True).stdout
                 for name in ("frames", "settings", "handshake")}
    except (OSError, subprocess.CalledProcessError) as err:
        pytest.skip(f"the base commit {BASE} is not in this repository's git: {err}")
    pkg = sys.modules.get("oldmesh")
    if pkg is not None:
        return pkg
    pkg = types.ModuleType("oldmesh")
    pkg.__path__ = []
    sys.modules["oldmesh"] = pkg
    for name in ("settings", "frames", "handshake"):
        src = texts[name].replace("from cluster import", "from oldmesh import").replace(
            "from cluster.", "from oldmesh.")
        spec = importlib.util.spec_from_loader(f"oldmesh.{name}", loader=None)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[f"oldmesh.{name}"] = mod
        exec(compile(src, f"{BASE}:cluster/{name}.py", "exec"), mod.__dict__)  # noqa: S102
        setattr(pkg, name, mod)
    return pkg


@pytest.mark.parametrize("old_side", ["dialer", "acceptor"])
@pytest.mark.parametrize("new_cap", [2, 3])
def test_the_version_2_build_links_with_a_new_router(old_side: str, new_cap: int) -> None:
    """The handshake code of the version-2 build (its frames too), against this one: a link at
    version 2 on both sides, whatever the new router's cap (its HELLO's tail is ignored, and
    a version-2 dialer is answered in version 2)."""
    old = _old_cluster()
    if old_side == "dialer":
        d, a = _sides(acceptor_cap=new_cap, dialer_cls=old.handshake.DialerHandshake)
    else:
        d, a = _sides(dialer_cap=new_cap, acceptor_cls=old.handshake.AcceptorHandshake)
    est_d, est_a = _run(d, a)
    assert est_d is not None and est_a is not None
    new = est_a if old_side == "dialer" else est_d
    assert new.version == 2


def test_version_2_entries_are_the_version_2_bytes_and_the_old_build_reads_them() -> None:
    old = _old_cluster()
    flags, tlen, body = frames.entry_body(frames.APPEND, "devices/d1/t", b"p", 1, False, None,
                                          "n1/0", "d1", -1, None)
    v2 = frames.encode_entries([frames.entry_bytes(5, frames.APPEND, flags, tlen, body)])
    assert v2 == old.frames.encode_entries([old.frames.entry_bytes(
        5, old.frames.APPEND, *old.frames.entry_body(frames.APPEND, "devices/d1/t", b"p", 1,
                                                     False, None, "n1/0", "d1", -1, None))])
    [(_, got)] = frames.FrameReader().feed(v2)
    [e] = old.frames.decode_entries(got)
    assert (e.seq, e.kind, e.device, e.payload) == (5, frames.APPEND, "d1", b"p")
    [e] = _decode_entries(got, 2)
    assert e.epoch == -1


# -- version 3 fields ------------------------------------------------------------------------
_ids = st.integers(0, 2**63 - 1)
_offsets = st.integers(-1, 2**62)
_epochs = st.integers(-1, 2**31 - 1)
_text = st.text(max_size=40)


@given(seq=_ids, epoch=st.integers(0, 2**32 - 1), device=_text, kinds=st.lists(
    st.sampled_from([frames.DELIVER, frames.APPEND, frames.RETAIN]), min_size=1, max_size=6))
def test_version_3_appends_carry_their_epoch_and_nothing_else_does(
        seq: int, epoch: int, device: str, kinds: list[int]) -> None:
    flags, tlen, body = frames.entry_body(frames.APPEND, "devices/x/t", b"pl", 1, False, None,
                                          None, device, 3, None)
    parts = []
    for i, kind in enumerate(kinds):
        if kind == frames.APPEND:
            parts.append(frames.entry_head_epoch(seq + i, kind, flags, tlen, epoch))
        else:
            parts.append(frames.entry_head(seq + i, kind, flags, tlen))
        parts.append(body)
    [(_, got)] = frames.FrameReader().feed(frames.encode_entries_parts(parts, len(kinds)))
    out = _decode_entries(got, 3)
    assert [e.kind for e in out] == kinds
    assert [e.epoch for e in out] == [epoch if k == frames.APPEND else -1 for k in kinds]
    assert all(e.device == device and e.payload == b"pl" for e in out)


@given(seq=_ids, epochs=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=6),
       device=_text)
def test_version_4_entries_all_carry_their_epoch(seq: int, epochs: list[int],
                                                 device: str) -> None:
    """From version 4 every entry head has the epoch: a DELIVER's is the one its sender
    routed the record at (cluster/deliverfence.py fences a deposed leader's by it)."""
    kinds = [(frames.DELIVER, frames.APPEND, frames.RETAIN)[i % 3] for i in range(len(epochs))]
    flags, tlen, body = frames.entry_body(frames.DELIVER, "devices/x/t", b"pl", 1, False, None,
                                          None, device, 3, None)
    parts = []
    for i, (kind, epoch) in enumerate(zip(kinds, epochs, strict=True)):
        parts += [frames.entry_head_epoch(seq + i, kind, flags, tlen, epoch), body]
    [(_, got)] = frames.FrameReader().feed(frames.encode_entries_parts(parts, len(kinds)))
    out = _decode_entries(got, 4)
    assert [e.kind for e in out] == kinds and [e.epoch for e in out] == epochs
    assert all(e.device == device and e.offset == 3 for e in out)


@given(req=_ids, device=_text, offset=_offsets, max_records=st.integers(0, 2**32 - 1),
       replica=_text, last_epoch=_epochs)
def test_fetch_round_trips_its_replica_and_last_epoch_at_version_3(
        req: int, device: str, offset: int, max_records: int, replica: str,
        last_epoch: int) -> None:
    f = frames.Fetch(req, device, offset, max_records, replica, last_epoch)
    [(_, body)] = frames.FrameReader().feed(frames.encode_fetch(f, 3))
    assert frames.decode_fetch(body, 3) == f
    [(_, body)] = frames.FrameReader().feed(frames.encode_fetch(f, 2))
    assert frames.decode_fetch(body, 2) == frames.Fetch(req, device, offset, max_records)


@given(req=_ids, status=st.sampled_from([0, 1, 2, 3, 4]), start=_offsets, hw=_offsets,
       nxt=_offsets, data=st.binary(max_size=64), end=_offsets, epoch=_epochs,
       div_epoch=_epochs, div_end=_offsets)
def test_records_round_trip_log_end_high_watermark_and_epochs_at_version_3(
        req: int, status: int, start: int, hw: int, nxt: int, data: bytes, end: int,
        epoch: int, div_epoch: int, div_end: int) -> None:
    r = frames.Records(req, status, start, hw, nxt, data, end, epoch, div_epoch, div_end)
    [(_, body)] = frames.FrameReader().feed(frames.encode_records(r, 3))
    assert frames.decode_records(body, 3) == r
    if status == frames.RECORDS_DIVERGING:
        with pytest.raises(ValueError):  # not in version 2: never sent to such a peer
            frames.encode_records(r, 2)
        return
    [(_, body)] = frames.FrameReader().feed(frames.encode_records(r, 2))
    assert frames.decode_records(body, 2) == frames.Records(req, status, start, hw, nxt, data)


def test_a_fenced_result_is_not_stored_to_a_version_2_reader() -> None:
    [(_, body)] = frames.FrameReader().feed(frames.encode_results(
        [(9, frames.RESULT_FENCED, -1, "fenced")]))
    assert frames.decode_results(body) == [(9, frames.RESULT_FENCED, -1, "fenced")]
    assert frames.RESULT_FENCED != frames.RESULT_STORED


# -- fencing ---------------------------------------------------------------------------------
def _led_by(placement: Placement, router: str) -> str:
    return next(d for d in (f"dev{i}" for i in range(10_000))
                if placement.leader_of(d).router == router)


def test_an_append_is_applied_only_by_the_leader_at_the_current_epoch() -> None:
    placement = Placement(["a/0", "b/0"], "b/0")
    mine, theirs = _led_by(placement, "b/0"), _led_by(placement, "a/0")
    assert append_refusal(placement, "b/0", mine, 0) is None
    assert append_refusal(placement, "b/0", mine, -1) is None  # a version-2 peer: no epoch
    why = append_refusal(placement, "b/0", mine, 1)
    assert why is not None and "epoch 1" in why and "epoch 0" in why and "fenced" in why
    why = append_refusal(placement, "b/0", theirs, 0)
    assert why is not None and "does not lead" in why and "a/0" in why
    assert append_refusal(placement, "b/0", theirs, -1) is not None  # version 2 too
    placement.update(mine, "b/0", 4)  # a leader election kept it here, at epoch 4
    assert append_refusal(placement, "b/0", mine, 4) is None
    assert "epoch 0" in (append_refusal(placement, "b/0", mine, 0) or "")
    assert placement.epoch_of(mine) == 4 and placement.epoch_of(theirs) == 0


@pytest.mark.parametrize("value", [1, 5, "3", True])
def test_a_protocol_version_this_build_does_not_speak_is_a_config_error(
        tmp_path: Path, value: object) -> None:
    from meshmq.config import ConfigError, load_config

    text = (f'[node]\nid = "a"\n[cluster]\nname = "c"\nsecret = "{SECRET.decode()}"\n'
            f"protocol_version = {str(value).lower() if isinstance(value, bool) else value!r}\n")
    path = tmp_path / "meshmq.toml"
    path.write_text(text.replace("'", '"'))
    with pytest.raises(ConfigError) as err:
        load_config(str(path), {})
    assert "cluster.protocol_version" in str(err.value)
    assert "between 2 and 4" in str(err.value)


def test_the_default_protocol_version_is_the_newest(tmp_path: Path) -> None:
    from meshmq.config import load_config

    path = tmp_path / "meshmq.toml"
    path.write_text(f'[node]\nid = "a"\n[cluster]\nname = "c"\nsecret = "{SECRET.decode()}"\n')
    assert load_config(str(path), {}).cluster.protocol_version == frames.VERSION == 4
    assert load_config(str(path), {"MESHMQ_CLUSTER__PROTOCOL_VERSION": "2"}
                       ).cluster.protocol_version == 2


def test_the_leader_answers_a_diverged_replica_with_the_epoch_and_where_it_ended(
        tmp_path: Path) -> None:
    """cluster/logserve.py with a real store holding epochs 1 (offsets 0-9) and 4 (10-12): a
    replica whose last fetched record was of epoch 3 (a leader that was deposed: epoch 3 never
    reached this log) at offset 12 is told "epoch 1 ended at 10" instead of records (KIP-595);
    one of epoch 4 at 12, or a reader (-1), gets records, with the log end, high-water mark
    and the leader's epoch."""
    from cluster.logserve import fetch_result, serve_fetch
    from commitlog.record import decode_batch
    from commitlog.settings import LogSettings
    from commitlog.store import LogStore

    store = LogStore.open(str(tmp_path / "log"), LogSettings())
    try:
        for epoch, n in ((1, 10), (4, 3)):
            assert store.start_epoch("d", epoch)
            for _ in range(n):
                store.append("d", 1_000 + store.log_end("d"), "t/d", 1, None, b"x")
            store.flush_sync_commit()
        r = serve_fetch(store, frames.Fetch(1, "d", 12, 100, "a/0", 3), 4)
        assert (r.status, r.diverging_epoch, r.diverging_end, r.data) == (
            frames.RECORDS_DIVERGING, 1, 10, b"")
        assert (r.log_end, r.high_watermark, r.leader_epoch) == (13, 13, 4)
        [(_, body)] = frames.FrameReader().feed(frames.encode_records(r, 3))
        assert "epoch 1 ended at offset 10" in fetch_result(frames.decode_records(body, 3)).why
        for last_epoch in (4, -1):
            r = serve_fetch(store, frames.Fetch(2, "d", 12, 100, "a/0", last_epoch), 4)
            assert (r.status, r.diverging_epoch, r.log_end, r.leader_epoch) == (
                frames.RECORDS_OK, -1, 13, 4)
            assert [x.offset for x in decode_batch(r.data)] == [12]
    finally:
        store.close()
