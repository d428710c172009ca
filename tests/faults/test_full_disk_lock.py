"""An --out on a disk with no byte free: the run fails with the disk's error (exit 4), not with
``internal error`` (exit 70) from closing the output lock whose description could not be written (issue 24,
item 8)."""

from __future__ import annotations

import contextlib

from fakes import harness
from fakes.media import moving_square_clip


def _fill(directory) -> None:  # type: ignore[no-untyped-def]
    with open(directory / "filler", "wb", buffering=0) as fh, contextlib.suppress(OSError):
        while True:
            fh.write(b"\0" * 4096)


def test_a_full_disk_is_an_output_error_not_an_internal_one(tmp_path):
    clip = moving_square_clip(count=6)
    with harness.small_disk(128) as disk:
        (disk / "o").mkdir()
        _fill(disk)
        r = harness.run_cli(["track", clip, "--point", "48,32", "--out", disk / "o"])
    assert r.returncode == 4, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert "internal error" not in r.stderr and "No space left" in lines[-1], r.stderr
