"""The owner's memory of APPEND outcomes (cluster/outcomes.py ``Outcomes``), sans-I/O: what
answers an APPEND resent because its RESULT was lost. The one property that matters most: a seq
it does not remember exactly is never answered, so never answered "stored" (the link then says
"outcome unknown", a failure). The real-process side is tests/cluster/test_append_outcomes.py."""

from __future__ import annotations

from cluster.outcomes import OUTCOMES_KEPT, Outcomes


def test_stored_and_failed_outcomes_are_answered_as_they_were() -> None:
    o = Outcomes()
    assert o.result(1) is None  # nothing yet (and nothing allocated)
    o.stored(1, 0)
    o.stored(2, 41)
    o.failed(3, 1, "disk full")
    assert o.result(1) == (1, 0, 0, "")
    assert o.result(2) == (2, 0, 41, "")
    assert o.result(3) == (3, 1, -1, "disk full")
    assert o.result(4) is None


def test_a_slot_taken_by_a_newer_seq_answers_nothing_for_the_older_one() -> None:
    """The ring reuses a slot every OUTCOMES_KEPT seqs: the older seq is forgotten, and must
    not be answered with the newer one's offset (a false "stored")."""
    o = Outcomes()
    o.failed(7, 1, "disk full")
    o.stored(7 + OUTCOMES_KEPT, 5)
    assert o.result(7) is None
    assert o.result(7 + OUTCOMES_KEPT) == (7 + OUTCOMES_KEPT, 0, 5, "")


def test_a_new_incarnation_forgets_everything() -> None:
    o = Outcomes()
    o.stored(1, 3)
    o.clear()
    assert o.result(1) is None
