"""``MetadataState`` (cluster/metastate.py) under random command sequences (hypothesis): the
invariants replication relies on hold after every command, whatever the order, the retries and
the stale epochs (a retry after an unknown outcome is the same command again)."""

from __future__ import annotations

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.metastate import MetadataState

ROUTERS = ["a/0", "b/0", "c/0"]
DEVICES = ["d1", "d2"]
_router = st.sampled_from(ROUTERS)
_device = st.sampled_from(DEVICES)
_epoch = st.sampled_from([0, 0, 1, 2])  # small: a matching epoch is common
_cmd = st.one_of(
    st.tuples(st.just("create_log"), _device, _router,
              st.lists(_router, min_size=1, max_size=3, unique=True)),
    st.tuples(st.just("elect"), _device, _epoch, _router),
    st.tuples(st.just("set_isr"), _device, _epoch, _epoch,
              st.lists(_router, min_size=1, max_size=3, unique=True)),
    st.tuples(st.just("claim_session"), st.sampled_from(["c1", "c2"]), _router),
    st.tuples(st.just("release_session"), st.sampled_from(["c1", "c2"]), _router, _epoch),
)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(_cmd, st.booleans()), max_size=40))
def test_invariants_hold_under_any_sequence_with_retries(steps) -> None:
    s = MetadataState()
    first: dict[str, dict] = {}  # each log's placement when created
    for cmd, retried in steps:
        before = copy.deepcopy(s.logs)
        sessions_before = copy.deepcopy(s.sessions)
        applied, record, change = s.apply(list(cmd))
        if retried:  # the same command again (an unknown outcome retried): never applied twice
            if cmd[0] != "claim_session":
                again, _, change2 = s.apply(list(cmd))
                assert not again and change2 is None
        assert (change is not None) == applied
        for device, rec in s.logs.items():
            assert rec["leader"] in rec["isr"], rec
            assert set(rec["isr"]) <= set(rec["replicas"]), rec
            old = before.get(device)
            if old is None:
                first.setdefault(device, rec)
                continue
            assert rec["epoch"] >= old["epoch"] and rec["isr_version"] >= old["isr_version"]
            assert rec["replicas"] == old["replicas"]  # placed once
            assert rec["incarnation"] == old["incarnation"]
            if rec["leader"] != old["leader"]:
                assert rec["epoch"] == old["epoch"] + 1 and rec["leader"] in old["isr"]
        for cid, rec in s.sessions.items():
            old = sessions_before.get(cid)
            assert old is None or rec["epoch"] >= old["epoch"]
    assert s.apply(["no_such_command"])[0] is False
    assert s.apply(["elect", "d1"])[0] is False  # malformed: refused, nothing changed
