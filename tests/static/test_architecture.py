"""The import rules of ``docs/architecture.md``, checked on every module's imports (including those inside
functions): a module imports only what the rule for its folder allows, so the dataflow stays readable from the
folder names alone."""

from __future__ import annotations

import ast
import graphlib
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "vostream"  # the package; the other code folders are linked into it

CORE = "vostream.pipeline"  # the engine and contracts
APPS = "vostream.apps"
FACADE = (
    "the facade"  # in a rule: `import vostream` itself (and vostream.facade, which it loads), nothing deeper
)

#: (module prefix, what its modules may import from vostream); the first matching prefix applies
RULES: list[tuple[str, tuple[str, ...]]] = [
    (APPS, ("vostream",)),  # applications: anything
    ("vostream.facade", ("vostream",)),  # the facade's implementation sits on top of everything
    # runnable examples use the public API: the facade, and the synthetic scenes of samples/
    ("vostream.samples.examples", (FACADE, "vostream.samples")),
    ("vostream.stages.sources", (CORE, "vostream.stages.sources")),
    (
        "vostream.stages.trackers.sam2.backends",
        (
            CORE,
            "vostream.stages.trackers.base",
            "vostream.stages.trackers.sam2.manifest",
            "vostream.stages.trackers.sam2.runtime",
            "vostream.stages.trackers.sam2.session",
            "vostream.stages.trackers.sam2.backends",
        ),
    ),
    ("vostream.stages.trackers", (CORE, "vostream.stages.trackers")),
    ("vostream.stages", (CORE, "vostream.stages")),
    ("vostream.sinks", (CORE, "vostream.sinks")),
    ("vostream.samples", (CORE, "vostream.samples")),
    ("vostream.web", ()),
    (CORE, (CORE,)),
]


def module_name(path: Path) -> str:
    """The module a file under ``vostream/`` is: its path, dots for slashes (one rule, no exception)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, name: str) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if node.module is None:  # `from . import x`: x may be a module
                found += [(node.lineno, f"{mod}.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, mod))
    return [(line, mod) for line, mod in found if mod == "vostream" or mod.startswith("vostream.")]


def allowed(importer: str, imported: str) -> bool:
    def within(mod: str, prefix: str) -> bool:
        return mod == prefix or mod.startswith(prefix + ".")

    if importer == "vostream":
        return True  # the facade sits on top of everything
    for prefix, may in RULES:
        if within(importer, prefix):
            if may == ("vostream",):
                return True
            if within(imported, APPS):
                return False  # nothing below the applications imports them
            facade = FACADE in may and imported in ("vostream", "vostream.facade")
            return facade or any(within(imported, m) for m in may)
    raise AssertionError(f"no import rule covers {importer}")


def product_modules() -> list[Path]:
    """Every module of the package, through the links (``os.walk`` follows them; the paths keep the link names)."""
    found = []
    for folder, dirs, files in os.walk(PACKAGE, followlinks=True):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        found += [Path(folder) / f for f in files if f.endswith(".py")]
    return sorted(found)


def test_every_module_follows_its_folders_import_rule():
    broken = []
    for path in product_modules():
        name = module_name(path)
        for line, mod in imports_of(path, name):
            if not allowed(name, mod):
                broken.append(f"{path.relative_to(ROOT)}:{line}: {name} imports {mod}")
    assert not broken, "imports against docs/architecture.md:\n" + "\n".join(broken)


@pytest.mark.parametrize(
    "importer, imported, ok",
    [
        ("vostream.pipeline.engine", "vostream.pipeline.types", True),
        ("vostream.pipeline.engine", "vostream.stages.track", False),
        ("vostream.pipeline.engine", "vostream.apps.track", False),
        ("vostream.sinks.rtsp", "vostream.stages.sources.live", False),
        ("vostream.stages.sources.live", "vostream.pipeline.reconnect", True),
        ("vostream.stages.trackers.sam2.backends.acl", "vostream.stages.trackers.sam2", False),
        ("vostream.stages.track", "vostream.apps.prompts", False),
        ("vostream.apps.serve.session", "vostream.sinks.websocket", True),
        ("vostream.samples.examples.custom_pipeline", "vostream", True),
        ("vostream.samples.examples.custom_pipeline", "vostream.pipeline.stage", False),
    ],
)
def test_the_rules_themselves(importer, imported, ok):
    """The checker refuses the backwards imports the layout removed (and allows the forward ones)."""
    assert allowed(importer, imported) is ok


def test_the_checker_sees_imports_inside_functions(tmp_path):
    mod = PACKAGE / "pipeline" / "engine.py"
    names = [m for _, m in imports_of(mod, "vostream.pipeline.engine")]
    assert "vostream.pipeline.errors" in names  # a relative, module-level import resolved
    src = tmp_path / "x.py"
    src.write_text("def f():\n    from vostream.stages.track import TrackStage\n")
    assert imports_of(src, "vostream.pipeline.x") == [(2, "vostream.stages.track")]


def test_docs_architecture_names_every_module_and_no_stale_one():
    """``docs/architecture.md`` lists every module by its path (folder = module path), and every ``.py`` path it
    names exists, so the map cannot drift from the tree."""
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`([\w/]+\.py)`", doc))
    modules = set()
    for path in product_modules():
        real = path.resolve().relative_to(ROOT).as_posix()  # pipeline/engine.py, vostream/apps/cli.py
        modules.add(real)
    missing = sorted(modules - named)
    assert not missing, "docs/architecture.md does not name: " + ", ".join(missing)
    tops = ("vostream/", "pipeline/", "stages/", "sinks/", "web/", "samples/")
    stale = sorted(p for p in named if p.startswith(tops) and not (ROOT / p).exists())
    assert not stale, "docs/architecture.md names modules that do not exist: " + ", ".join(stale)


def import_graph() -> dict[str, set[str]]:
    """Module -> the product modules it imports (at module level or inside functions: a lazy import still ties the
    two modules together).  ``from a.b import c`` counts as an import of ``a.b.c`` when that is a module, else of
    ``a.b``; the parent packages a Python import also runs are not edges."""
    paths = {module_name(path): path for path in product_modules()}

    def module_of(name: str) -> str:
        while name not in paths and "." in name:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        graph[name] = {module_of(mod) for _, mod in imports_of(path, name)} - {name}
    return graph


def import_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` (its first module repeated at the end), or None when it has none."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        return list(reversed(exc.args[1]))  # graphlib lists it against the edges' direction
    return None


def test_no_module_imports_itself_through_others():
    """No import cycle anywhere in the product (``vostream.apps`` included): two modules that need each other
    are one module, or a third one holds what both need."""
    cycle = import_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_check_finds_a_cycle():
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) in (
        ["a", "b", "c", "a"],
        ["b", "c", "a", "b"],
        ["c", "a", "b", "c"],
    )
    graph = import_graph()
    # edges name modules, relative imports resolved
    assert "vostream.pipeline.types" in graph["vostream.stages.trackers.base"]
    assert "vostream.stages.trackers.base" in graph["vostream.stages.trackers.sam2.session"]
