"""Shared fixtures.  ``sam2_tiny``: a tiny random SAM-2-family checkpoint and its export, made once per session."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

pytest_plugins = ["skip_guard"]  # under CI, a skip for a missing install fails the run


#: fixtures that export a tiny SAM-2 checkpoint: ``sam2_tiny`` and test_sam2_cli's export through the CLI
EXPORT_FIXTURES = ("sam2_tiny", "exported")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that needs an exported tiny SAM-2 checkpoint (an :data:`EXPORT_FIXTURES` fixture, directly or through
    another fixture) is ``slow``: the export is the expensive part of the suite, so the fast run leaves them out."""
    for item in items:
        if any(name in EXPORT_FIXTURES for name in getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def sam2_tiny(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[Path, Path]]:
    """``sam2_tiny(family) -> (checkpoint_dir, export_dir)`` for family in sam2 / edgetam / sam3_tracker.

    The checkpoint comes from ``tests/fakes/sam2_reference.save_tiny`` (random weights, no downloads); the export is
    ``vostream export``'s.  Skips when torch / transformers are not installed."""
    cache: dict[str, tuple[Path, Path]] = {}

    def make(family: str) -> tuple[Path, Path]:
        if family not in cache:
            reason = "torch and transformers make the tiny checkpoint; pip install -e '.[test]'"
            pytest.importorskip("torch", reason=reason)
            pytest.importorskip("transformers", reason=reason)
            from fakes import sam2_reference as ref

            from vostream.apps.export import export_model

            root = tmp_path_factory.mktemp(f"sam2_{family}")
            ckpt = ref.save_tiny(family, root / "ckpt")
            out = root / "export"
            export_model(str(ckpt), out)
            cache[family] = (ckpt, out)
        return cache[family]

    return make
