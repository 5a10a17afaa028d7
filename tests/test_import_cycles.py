"""No import cycle between the top-level folders: each folder's imports (module level or inside
functions: a lazy import is still a dependency) are parsed, mapped to the folder they reach, and
the folder graph must have no cycle. `import toolflash` for the package root (`__version__`, the
installed path) is not a dependency on the `toolflash/` folder's modules."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Subpackages of the `toolflash` namespace, each its own folder; `toolflash` is the folder of
# the CLI, benchmarks and commands.
SUBPACKAGES = ("engine", "cache", "gateway", "policy", "kernels", "zoo", "training", "configs")
FOLDERS = (*SUBPACKAGES, "toolflash")

Edges = dict[tuple[str, str], list[str]]


def _folder(module: str) -> str | None:
    """The folder a `toolflash.*` module lives in (None: not ours, or the bare package root)."""
    parts = module.split(".")
    if parts[0] != "toolflash" or len(parts) == 1:
        return None
    if parts[1] in SUBPACKAGES:
        return parts[1]
    return "toolflash"


def _imported(node: ast.AST, package: list[str], root: Path) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = ".".join(package[: len(package) - node.level + 1])
        module = f"{base}.{node.module}" if node.module else base
    else:
        module = node.module or ""
    if module != "toolflash":
        return [module]
    # `from toolflash import engine` (or `cli`) names a module; `import __version__` the root's.
    own = root / "toolflash"
    return [
        f"toolflash.{a.name}"
        if a.name in SUBPACKAGES or (own / f"{a.name}.py").exists() or (own / a.name).is_dir()
        else "toolflash"
        for a in node.names
    ]


def folder_edges(root: Path = ROOT) -> Edges:
    """(from folder, to folder) -> where ("path:line module")."""
    edges: Edges = defaultdict(list)
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            if "assets" in path.parts:
                continue
            rel = path.relative_to(root / folder)
            package = ["toolflash"] + ([] if folder == "toolflash" else [folder])
            package += list(rel.parts[:-1])
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                for module in _imported(node, package, root):
                    target = _folder(module)
                    if target is not None and target != folder:
                        where = f"{path.relative_to(root)}:{getattr(node, 'lineno', 0)} {module}"
                        edges[(folder, target)].append(where)
    return edges


def find_cycle(edges: Edges) -> list[str] | None:
    """One cycle of the folder graph as [a, b, ..., a], or None."""
    graph: dict[str, list[str]] = defaultdict(list)
    for a, b in edges:
        graph[a].append(b)
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_no_import_cycle_between_top_level_folders() -> None:
    edges = folder_edges()
    cycle = find_cycle(edges)
    if cycle is not None:
        hops = [
            f"{a} -> {b}: {', '.join(edges[(a, b)][:3])}"
            for a, b in zip(cycle, cycle[1:], strict=False)
        ]
        raise AssertionError("import cycle between folders:\n" + "\n".join(hops))


def test_the_cycle_check_finds_a_cycle(tmp_path: Path) -> None:
    for folder in FOLDERS:
        (tmp_path / folder).mkdir()
    (tmp_path / "engine" / "a.py").write_text("from toolflash.cache.b import B\n")
    (tmp_path / "cache" / "b.py").write_text("def f():\n    from ..engine import a\n")
    (tmp_path / "gateway" / "c.py").write_text(
        "import toolflash\nfrom toolflash import __version__\n"
    )
    edges = folder_edges(tmp_path)
    assert set(edges) == {("engine", "cache"), ("cache", "engine")}
    assert find_cycle(edges) == ["cache", "engine", "cache"]
    del edges[("cache", "engine")]
    assert find_cycle(edges) is None
