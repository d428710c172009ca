"""Static checks, run with the suite so that ``.ci/run`` (which runs the suite) enforces them: mypy clean on the
package (STYLE: "mypy clean on the package"), ruff's lint rules and ruff's formatting (``pyproject.toml``) on
every Python file of the repository."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_mypy_clean(tmp_path):
    """Plain ``mypy`` from the repository root, as a developer runs it: ``[tool.mypy] files`` names the package."""
    pytest.importorskip("mypy", reason="mypy is part of the [test] extra: pip install -e '.[test]'")
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / ".mypy_cache")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("ruff", reason="ruff is part of the [test] extra: pip install -e '.[test]'")
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_ruff_lint_clean():
    r = _ruff("check", "--no-cache", ".")
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_format_clean():
    r = _ruff("format", "--no-cache", "--check", ".")
    assert r.returncode == 0, "run `ruff format .`:\n" + r.stdout + r.stderr
