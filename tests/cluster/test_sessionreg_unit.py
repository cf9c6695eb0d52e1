"""The session registry's commands in ``MetadataState`` (cluster/metastate.py), sans-I/O: what
``cluster/sessionreg.py`` and the routers rely on."""

from __future__ import annotations

from cluster.metastate import MetadataState


def test_a_claim_answers_with_the_previous_holder_and_the_saved_state() -> None:
    s = MetadataState()
    ok, rec, change = s.apply(["claim_session", "c", "a/0"])
    assert ok and rec == {"router": "a/0", "epoch": 1, "prev": None, "state": None}
    assert change == ("session", "c", {"router": "a/0", "epoch": 1})  # no state to watchers
    ok, _, change = s.apply(["save_session", "c", "a/0", 1, '{"v":1}'])
    assert ok and change == ("session_state", "c", {"epoch": 1, "bytes": 7})
    ok, rec, _ = s.apply(["claim_session", "c", "b/0"])
    assert rec == {"router": "b/0", "epoch": 2, "prev": "a/0", "state": '{"v":1}'}
    assert "state" not in s.snapshot()["sessions"]["c"]  # watchers never get the states


def test_a_save_under_a_stale_claim_is_refused() -> None:
    s = MetadataState()
    s.apply(["claim_session", "c", "a/0"])
    s.apply(["claim_session", "c", "b/0"])  # a/0's claim (epoch 1) is taken over
    ok, rec, change = s.apply(["save_session", "c", "a/0", 1, "old"])
    assert not ok and change is None and rec == {"router": "b/0", "epoch": 2}
    assert s.apply(["claim_session", "c", "a/0"])[1]["state"] is None


def test_a_clean_claim_drops_the_state_and_a_release_drops_both() -> None:
    s = MetadataState()
    s.apply(["claim_session", "c", "a/0"])
    s.apply(["save_session", "c", "a/0", 1, "st"])
    ok, rec, _ = s.apply(["claim_session", "c", "b/0", True])
    assert rec["state"] is None and rec["prev"] == "a/0"
    assert s.apply(["claim_session", "c", "b/0"])[1]["state"] is None  # gone, not just unsaid
    s.apply(["save_session", "c", "b/0", 3, "st2"])
    assert s.apply(["release_session", "c", "b/0", 3])[0]
    assert "c" not in s.sessions
    assert s.apply(["claim_session", "c", "a/0"])[1]["state"] is None


def test_epochs_never_go_back_after_a_release() -> None:
    """A router's watch may show an old claim after its own newer one was answered: a claim
    after a release must still get a higher epoch than any before it."""
    s = MetadataState()
    s.apply(["claim_session", "c", "a/0"])
    _, rec, _ = s.apply(["claim_session", "c", "b/0"])
    assert s.apply(["release_session", "c", "b/0", rec["epoch"]])[0]
    _, again, _ = s.apply(["claim_session", "c", "a/0"])
    assert again["epoch"] > rec["epoch"], (again, rec)
