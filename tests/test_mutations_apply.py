"""Every planted bug in ``tests/mutate.py`` still plants: its text occurs exactly once in its
file and the tests it names exist.

Why in the suite: ``tests/mutate.py`` takes hours on 2 cores, so it runs before resolving an
issue, not in CI; a refactor that moves the guarded code used to leave mutations stale until
that run (five were found at once in one session). This check costs a second, so a move that
strands a mutation fails CI at once and the mover updates it in the same change.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _mutations() -> tuple:
    spec = importlib.util.spec_from_file_location("meshmq_mutate", ROOT / "tests" / "mutate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("meshmq_mutate", module)
    spec.loader.exec_module(module)
    return module.MUTATIONS


MUTATIONS = _mutations()


def test_names_are_unique() -> None:
    names = [m.name for m in MUTATIONS]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


@pytest.mark.parametrize("m", MUTATIONS, ids=lambda m: m.name)
def test_mutation_still_plants(m) -> None:
    text = (ROOT / m.path).read_text()
    assert text.count(m.old) == 1, (
        f"{m.name}: its text occurs {text.count(m.old)} times in {m.path} (expected once): "
        "the code it guards moved; update the mutation with the move")
    at = text.find(m.old)
    if at > 0 and (m.old[0].isalnum() or m.old[0] == "_"):
        before = text[at - 1]
        # "VERSION = 2" once matched inside "MIN_VERSION = 2": the plant changed another name
        assert not (before.isalnum() or before == "_"), (
            f"{m.name}: its text starts inside a longer name in {m.path} "
            f"({text[max(0, at - 20):at + 20]!r}): anchor it on the whole name")
    assert m.new != m.old
    for test in m.tests:
        path = test.split("::")[0]
        assert (ROOT / path).exists(), f"{m.name}: test file {path} does not exist"
