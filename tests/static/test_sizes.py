"""No giant grows back (issue 23, item 4): in the product, no function is over 80 lines and no class over 400.
An exception must be listed here with its reason, and a listed exception that is no longer over the limit fails
too, so the list stays true."""

from __future__ import annotations

import ast
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "vostream"
MAX_FUNCTION_LINES = 80
MAX_CLASS_LINES = 400

#: "module:qualified.name" -> why it may be longer (none today)
EXCEPTIONS: dict[str, str] = {}


def _oversized(path: Path, module: str) -> list[tuple[str, int, int]]:
    """(``module:Qual.name``, lines, limit) for each function or class of ``path`` over its limit."""
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                assert child.end_lineno is not None
                lines = child.end_lineno - child.lineno + 1
                limit = MAX_CLASS_LINES if isinstance(child, ast.ClassDef) else MAX_FUNCTION_LINES
                if lines > limit:
                    found.append((f"{module}:{name}", lines, limit))
                visit(child, f"{name}.")

    visit(ast.parse(path.read_text(encoding="utf-8")), "")
    return found


def product_sizes() -> list[tuple[str, int, int]]:
    found = []
    for folder, dirs, files in os.walk(
        PACKAGE, followlinks=True
    ):  # the code folders are linked into vostream/
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for f in files:
            if f.endswith(".py"):
                path = Path(folder) / f
                module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
                found += _oversized(path, module)
    return found


def test_no_function_over_80_lines_and_no_class_over_400():
    unlisted = [
        f"{name}: {n} lines (limit {limit})" for name, n, limit in product_sizes() if name not in EXCEPTIONS
    ]
    assert not unlisted, "split these, or list them in EXCEPTIONS with a reason:\n" + "\n".join(unlisted)


def test_every_listed_exception_is_still_needed():
    names = {name for name, _, _ in product_sizes()}
    stale = sorted(set(EXCEPTIONS) - names)
    assert not stale, f"no longer over the limit, remove from EXCEPTIONS: {stale}"


def test_the_check_sees_methods_and_nested_functions(tmp_path):
    body = "".join(f"        x{i} = {i}\n" for i in range(85))
    src = tmp_path / "m.py"
    src.write_text(f"class A:\n    def f(self):\n{body}")
    assert _oversized(src, "m") == [("m:A.f", 86, 80)]
