"""The one rule from folder to package (``docs/architecture.md``): ``vostream/`` is the package ``vostream`` and
every other code folder X is ``vostream.X``; one module object per file in editable and regular installs alike;
the engine imports light."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CODE_FOLDERS = ("pipeline", "stages", "sinks", "web", "samples")

# Imports every module of the installed package it finds (the optional runtimes' modules may fail to import where
# their dependency is missing), then reports modules that share a file and the facade's identities.
_PROBE = r"""
import importlib, json, os, pkgutil, sys
import vostream
failed = []
for info in pkgutil.walk_packages(vostream.__path__, "vostream."):
    try:
        importlib.import_module(info.name)
    except Exception as e:  # an optional dependency (ray, ...) missing here
        failed.append(f"{info.name}: {type(e).__name__}")
by_file = {}
for name, mod in list(sys.modules.items()):
    f = getattr(mod, "__file__", None)
    if (name == "vostream" or name.startswith("vostream.")) and f:
        by_file.setdefault(os.path.realpath(f), []).append(name)
import vostream.facade, vostream.pipeline.types
print(json.dumps({
    "shared": {f: n for f, n in by_file.items() if len(n) > 1},
    "modules": sum(len(n) for n in by_file.values()),
    "files": sorted(by_file),
    "failed": failed,
    "same_stream": vostream.Stream is vostream.facade.Stream,
    "same_prompt": vostream.Prompt is vostream.pipeline.types.Prompt,
}))
"""


def _probe(env: dict[str, str] | None = None, cwd: Path | None = None) -> dict:
    r = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300, env=env, cwd=cwd
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_every_code_folder_is_linked_into_the_package():
    for name in CODE_FOLDERS:
        link = ROOT / "vostream" / name
        assert link.is_symlink(), f"vostream/{name} should be a link to ../{name}"
        assert os.readlink(link) == f"../{name}"  # relative: works in any clone
        assert (link / "__init__.py").exists()


def test_one_module_object_per_file_in_this_install(tmp_path):
    """The install the tests run against (editable in CI): every file is one module, the facade's names are the
    defining modules' objects (they were two objects when the facade folder was also ``vostream.pipeline.api``)."""
    found = _probe(cwd=tmp_path)
    assert found["shared"] == {}
    assert found["same_stream"] and found["same_prompt"]
    assert found["modules"] >= 60  # the walk reached the package (not an empty namespace)


@pytest.mark.slow
def test_one_module_object_per_file_in_a_regular_install(tmp_path):
    """``pip install .`` (a wheel, files copied through the links): the same package, one module per file."""
    # a copy of what the build reads, links kept as links (setuptools writes build/ beside the sources)
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for name in ("vostream", *CODE_FOLDERS):
        shutil.copytree(ROOT / name, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / "site"
    r = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert (target / "vostream" / "pipeline" / "engine.py").is_file()  # a copy, not a link
    assert not (target / "vostream" / "pipeline").is_symlink()
    assert (target / "vostream" / "web" / "index.html").is_file()
    env = {**os.environ, "PYTHONPATH": str(target)}
    found = _probe(env=env, cwd=tmp_path)
    assert found["shared"] == {}
    assert found["same_stream"] and found["same_prompt"]
    assert all(f.startswith(str(target)) for f in found["files"]), "imported from outside the regular install"


def test_importing_the_engine_loads_no_opencv_pyav_or_numpy(tmp_path):
    code = (
        "import sys, vostream.pipeline; print(sorted(m for m in ('cv2', 'av', 'numpy') if m in sys.modules))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_the_facade_names_all_resolve():
    import vostream

    for name in vostream.__all__:
        assert getattr(vostream, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        vostream.nope  # noqa: B018
