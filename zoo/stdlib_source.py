"""Python standard-library source as corpus material: file discovery, held-out split, functions.

The file list is sorted and filtered the same way on every run; the split between training and
evaluation files is a hash of the path relative to the stdlib root, so it does not depend on the
seed or on where Python is installed.
"""

from __future__ import annotations

import ast
import hashlib
import sysconfig
import textwrap
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

HELD_OUT_PERCENT = 5
# encodings/ is mostly generated codec tables: no use as code to learn from.
_SKIP_PARTS = {
    "site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "turtledemo", "encodings",
}  # fmt: skip


@dataclass(frozen=True)
class FunctionSource:
    """One function or method with a docstring, dedented."""

    module: str
    name: str
    header: str  # the `def` line(s) plus the docstring, i.e. what the user asks for
    source: str  # the full function
    doc: str  # the cleaned docstring


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


@lru_cache(maxsize=1)
def stdlib_files() -> tuple[str, ...]:
    """Sorted stdlib `.py` paths relative to the stdlib root, without tests and site-packages."""
    root = stdlib_root()
    out = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if any(p in _SKIP_PARTS or p.startswith("test_") for p in rel.parts):
            continue
        out.append(rel.as_posix())
    return tuple(sorted(out))


def is_held_out(rel_path: str) -> bool:
    """True for the ~5% of files reserved for evaluation prompts (stable hash of the path)."""
    digest = hashlib.sha256(rel_path.encode()).digest()
    return int.from_bytes(digest[:4], "big") % 100 < HELD_OUT_PERCENT


def file_list_hash() -> str:
    """Hash of the file list, recorded with the corpus (stdlib differs between Python versions)."""
    return hashlib.sha256("\n".join(stdlib_files()).encode()).hexdigest()[:16]


def read_source(rel_path: str) -> str:
    try:
        return (stdlib_root() / rel_path).read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return ""


def module_name(rel_path: str) -> str:
    name = rel_path[:-3].replace("/", ".")
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


def code_chunks(text: str, max_chars: int = 2400) -> list[str]:
    """Split source on blank-line boundaries into chunks of at most ~max_chars."""
    chunks: list[str] = []
    current: list[str] = []
    size = 0
    for block in text.split("\n\n"):
        if size + len(block) > max_chars and current:
            chunks.append("\n\n".join(current))
            current, size = [], 0
        current.append(block[: max_chars * 2])
        size += len(block) + 2
    if current:
        chunks.append("\n\n".join(current))
    return [c for c in chunks if c.strip()]


def functions(rel_path: str, max_lines: int = 40) -> list[FunctionSource]:
    """Functions and methods of one file that have a docstring and at most `max_lines` lines."""
    text = read_source(rel_path)
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    lines = text.splitlines()
    out: list[FunctionSource] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        doc = ast.get_docstring(node)
        if not doc or len(node.body) < 2 or node.end_lineno is None:
            continue
        start = min([d.lineno for d in node.decorator_list] + [node.lineno]) - 1
        if node.end_lineno - start > max_lines:
            continue
        body_start = node.body[1].lineno - 1
        source = textwrap.dedent("\n".join(lines[start : node.end_lineno]))
        header = textwrap.dedent("\n".join(lines[start:body_start])).rstrip()
        if not header or not source.strip():
            continue
        out.append(FunctionSource(module_name(rel_path), node.name, header, source, doc.strip()))
    out.sort(key=lambda f: (f.name, f.source))
    return out
