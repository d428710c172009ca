"""A pytest plugin: under CI (``CI`` set, as ``.ci/run`` runs), a skipped test or test module fails the run.

Every optional part the suite needs is installed there: the ``[test]`` extra (torch is pre-installed by
``.ci/run``), ffmpeg, GStreamer's RTSP server and Chromium.  A skip in CI therefore means a missing install step
that would otherwise let CI go green having run none of those tests.  The only skips allowed are the ones below,
which depend on the machine rather than on what was installed.  Outside CI, skips stay skips (a developer
without Chromium still runs the rest)."""

from __future__ import annotations

import os
from typing import Any

import pytest

#: skip reasons that are about the machine, not about a missing install
ALLOWED = (
    "a real pyACL is importable here",  # the fake-ACL tests need the real one absent
    "root can write to read-only directories",  # CI runs as root
)

_skips: list[str] = []


def _strict(config: pytest.Config) -> bool:
    return bool(os.environ.get("CI")) or os.environ.get("VOSTREAM_STRICT_SKIPS") == "1"


def _record(report: Any) -> None:
    if not report.skipped or getattr(report, "wasxfail", None) is not None:
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if not any(ok in reason for ok in ALLOWED):
        _skips.append(f"{report.nodeid}: {reason}")


def pytest_collectreport(report: pytest.CollectReport) -> None:
    _record(report)  # a module-level importorskip skips the whole module at collection


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _record(report)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _skips and _strict(session.config):
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = ["skipped in CI (a missing install step?):", *(f"  {s}" for s in _skips)]
        if reporter is not None:
            reporter.write_line("\n".join(lines), red=True, bold=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
