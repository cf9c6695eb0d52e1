"""ruff is part of the suite so that CI and the README's one test command both enforce it."""

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


def _package_imports(package: str) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports, from every import statement in it:
    top level, inside functions, and under ``if TYPE_CHECKING:`` (a type-only circle still
    means no file of it can be read alone)."""
    import ast

    modules = {p.stem: p for p in (ROOT / package).glob("*.py") if p.stem != "__init__"}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module == package:  # from cluster import frames
                    targets = [a.name for a in node.names]
                elif node.module.startswith(package + "."):
                    targets = [node.module.split(".")[1]]
            elif isinstance(node, ast.Import):
                targets = [a.name.split(".")[1] for a in node.names
                           if a.name.startswith(package + ".")]
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: one path per circle found by a depth-first walk."""
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def walk(node: str, path: list[str]) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                found.append([*path[path.index(nxt):], nxt])
            elif nxt not in state:
                walk(nxt, path)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            walk(node, [])
    return found


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_cluster_has_no_import_circle():
    """The link knows the mesh through the interface it declares (cluster/link.py
    ``LinkHost``), the connection its link and mesh likewise: imports go one way (issue 26)."""
    graph = _package_imports("cluster")
    assert {"link", "mesh", "connection", "retainsync"} <= set(graph)
    assert "link" in graph["mesh"]  # the walk sees imports at all
    circles = _cycles(graph)
    assert not circles, "import circles in cluster/: " + "; ".join(
        " -> ".join(c) for c in circles)
