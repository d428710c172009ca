"""The skip guard (``tests/skip_guard.py``) turns a skip for a missing dependency into a failed run under CI, and
leaves it a skip elsewhere; the machine-dependent skips it allows stay allowed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]

MODULE = """
import pytest
pytest.importorskip("a_module_nobody_installed")

def test_never_runs():
    assert False
"""

ALLOWED = """
import pytest

@pytest.mark.skipif(True, reason="root can write to read-only directories")
def test_machine_dependent():
    assert False

def test_runs():
    assert True
"""


def run(tmp_path: Path, source: str, ci: bool) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_probe.py").write_text(source)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "VOSTREAM_STRICT_SKIPS")}
    if ci:
        env["CI"] = "true"
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "skip_guard",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            str(tmp_path / "test_probe.py"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
    )


@pytest.mark.slow
def test_a_missing_dependency_fails_the_run_in_ci(tmp_path):
    r = run(tmp_path, MODULE, ci=True)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "skipped in CI" in r.stdout and "a_module_nobody_installed" in r.stdout


def test_outside_ci_a_skip_is_a_skip(tmp_path):
    r = run(tmp_path, MODULE, ci=False)
    assert r.returncode == 5, (
        r.stdout + r.stderr
    )  # pytest's "no tests ran": the module was skipped, not failed
    assert "1 skipped" in r.stdout


def test_machine_dependent_skips_are_allowed_in_ci(tmp_path):
    r = run(tmp_path, ALLOWED, ci=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 passed, 1 skipped" in r.stdout
