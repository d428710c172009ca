"""pyproject.toml's dependency floors are real: the lowest versions (``tests/min-constraints.txt``) are installed
in a fresh virtual environment and the core tests (engine, sources, sinks, stages, the track job, the viewer
server, the facade) run against them.

The environment is cached per constraints file under ``~/.cache/vostream/floors-<hash>`` (a first run downloads
about 150 MB from PyPI; later runs reuse it)."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONSTRAINTS = ROOT / "tests" / "min-constraints.txt"
CORE_TESTS = [  # relative to tests/
    "engine/test_pipeline_engine.py",
    "engine/test_pipeline_metrics.py",
    "sources/test_sources.py",
    "sinks/test_sinks.py",
    "engine/test_postprocess.py",
    "engine/test_preprocess_track_stage.py",
    "engine/test_track_pipeline.py",
    "apps/test_prompts_config.py",
    "apps/test_api.py",
    "samples/test_scenes.py",
    "apps/test_serve.py",
]

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def _pins() -> dict[str, str]:
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, ver = line.partition("==")
            pins[name.lower().replace("_", "-")] = ver
    return pins


def _floors() -> dict[str, str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    floors = {}
    for dep in deps:
        if ";" in dep:  # environment markers (tomli on Python < 3.11): not installed here
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9.]+)", dep.strip())
        assert m, f"dependency {dep!r} has no plain '>=' floor"
        floors[m.group(1).lower().replace("_", "-")] = m.group(2)
    return floors


def test_constraints_pin_exactly_the_floors():
    pins, floors = _pins(), _floors()
    assert set(pins) == set(floors), "tests/min-constraints.txt and pyproject.toml list different packages"
    for name, floor in floors.items():
        assert pins[name].startswith(floor), f"{name}: pyproject floor {floor}, constraints pin {pins[name]}"


@pytest.mark.slow
def test_core_tests_pass_at_the_floors(tmp_path):
    key = hashlib.sha256(CONSTRAINTS.read_bytes()).hexdigest()[:12]
    env_dir = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "vostream" / f"floors-{key}"
    python = env_dir / "bin" / "python"
    if not (env_dir / "ready").exists():
        venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
        r = subprocess.run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                "-c",
                str(CONSTRAINTS),
                *_pins(),
                "pytest",
                "pytest-timeout",
                "psutil",
            ],
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert r.returncode == 0, "installing the floors failed:\n" + r.stdout[-3000:] + r.stderr[-3000:]
        (env_dir / "ready").write_text("ok")
    installed = (
        subprocess.run(
            [str(python), "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True, check=True
        )
        .stdout.lower()
        .replace("_", "-")
    )
    for name, ver in _pins().items():
        assert f"{name}=={ver}" in installed, f"{name} {ver} is not what the floors environment holds"
    # the checkout imports as `vostream` from its root (the code folders are linked into vostream/)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "VOSTREAM_STRICT_SKIPS", "PYTHONPATH")}
    env["PYTHONPATH"] = str(ROOT)
    r = subprocess.run(
        [
            str(python),
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-x",
            *(str(ROOT / "tests" / t) for t in CORE_TESTS),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    tail = r.stdout[-4000:] + r.stderr[-2000:]
    assert r.returncode == 0, "core tests at the dependency floors:\n" + tail
    assert re.search(r"\d+ passed", r.stdout), tail
