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


def test_cluster_has_no_import_circle():
    """The link knows the mesh through the interface it declares (cluster/link.py
    ``LinkHost``), the connection its link and mesh likewise: imports go one way (issue 26)."""
    graph = import_graph("cluster")
    assert "cluster.link" in graph["cluster.mesh"]  # the walk sees imports at all
    circles = strongly_connected(graph)
    assert not circles, "import circles in cluster/: " + "; ".join(
        " <-> ".join(c) for c in circles)


# -- the router's walls (issue 26) -------------------------------------------------------------
# broker/router.py keeps the state, the dispatch table and the per-tick flush; its rooms (the
# modules below, mixins of ``Router``: the router's own implementation, sharing its ``self``)
# hold the rest. Everything else reaches the router through the public port of broker/port.py.
ROUTER_FILES = {
    "broker/router.py", "broker/handle_connect.py", "broker/handle_publish.py",
    "broker/handle_acks.py", "broker/handle_subscribe.py", "broker/ingest.py",
    "broker/delivery.py", "broker/sessionend.py", "broker/publishrun.py",
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


def _imports(path: Path, package: str) -> set[str]:
    """Modules of ``package`` that ``path`` imports, TYPE_CHECKING and function-level imports
    included (a type reference is still a reference a reader must follow)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.split(".")[0] == package:
            out.add(node.module)
            for alias in node.names:  # "from broker import x" names a module
                if node.module == package:
                    out.add(f"{package}.{alias.name}")
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == package)
    return out


def import_graph(package: str, root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports (dotted names)."""
    graph: dict[str, set[str]] = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        graph[name] = _imports(path, package)
    for name in graph:
        graph[name] = {m for m in graph[name] if m in graph and m != name}
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: its strongly connected groups of more than one
    module, Tarjan's algorithm (one group per circle of circles, however many paths)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def import_cycles(package: str, root: Path = ROOT) -> list[list[str]]:
    return strongly_connected(import_graph(package, root))


def test_the_cycle_finder_finds_a_circle():
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [
        ["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_broker_imports_go_one_way():
    cycles = import_cycles("broker")
    assert not cycles, ("import cycles in broker/ (TYPE_CHECKING imports count; move the shared "
                        "type down into a module that imports nothing above it):\n"
                        + "\n".join(" <-> ".join(c) for c in cycles))
