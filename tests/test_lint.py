"""ruff is part of the suite so that CI and the README's one test command both enforce it."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_clean():
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "."],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# -- the router's walls (issue 26) -------------------------------------------------------------
# broker/router.py keeps the state, the dispatch table and the per-tick flush; its rooms (the
# modules below, mixins of ``Router``: the router's own implementation, sharing its ``self``)
# hold the rest. Everything else reaches the router through the public port of broker/port.py.
ROUTER_FILES = {
    "broker/router.py", "broker/handlers.py", "broker/connect.py", "broker/ingest.py",
    "broker/delivery.py", "broker/sessionend.py",
}
ROUTER_MAX_LINES = 500
# Names that hold a router outside its own files: the constructor argument and attribute
# (``router``, ``self.router``, ``self._router``), and the short forms used in bound locals
# (``r = self.router``). A rule on names, not types: Python has no static types to ask, and every
# holder of a router in this tree is spelled one of these ways (a new spelling is a review
# matter; the list is the convention).
ROUTER_NAMES = {"router", "_router", "r", "rt"}
_SCANNED = ("broker", "cluster", "meshmq")


def _router_name(node: ast.expr) -> str | None:
    """The router-holding name ``node`` spells (``router``, ``self.router``, ...), or None."""
    if isinstance(node, ast.Name) and node.id in ROUTER_NAMES:
        return node.id
    if isinstance(node, ast.Attribute) and node.attr in ROUTER_NAMES \
            and isinstance(node.value, ast.Name) and node.value.id == "self":
        return "self." + node.attr
    return None


def private_router_accesses(root: Path = ROOT) -> list[str]:
    """``file:line: name._attr`` for every private attribute (one leading underscore, not a
    dunder) read or written on a router-holding name outside the router's own files."""
    found = []
    for package in _SCANNED:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel in ROUTER_FILES:
                continue
            for node in ast.walk(ast.parse(path.read_text(), rel)):
                if isinstance(node, ast.Attribute) and node.attr.startswith("_") \
                        and not node.attr.startswith("__"):
                    holder = _router_name(node.value)
                    if holder is not None:
                        found.append(f"{rel}:{node.lineno}: {holder}.{node.attr}")
    return found


def test_nothing_outside_the_router_touches_its_private_names():
    found = private_router_accesses()
    assert not found, ("private router names used outside the router (add a public name to "
                       "broker/port.py instead):\n" + "\n".join(found))
def test_router_py_stays_small():
    lines = len((ROOT / "broker/router.py").read_text().splitlines())
    assert lines <= ROUTER_MAX_LINES, (
        f"broker/router.py has {lines} lines (limit {ROUTER_MAX_LINES}): the router keeps its "
        "state, dispatch and flush; put new logic in a room named for what it does")


