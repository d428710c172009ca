"""Deeply nested JSON or TOML (a 400 KB file of brackets) in a prompts file, a track config or a deployment file:
one line and exit 2, where it was ``internal error: RecursionError`` (exit 70) (issue 24, item 7)."""

from __future__ import annotations

import pytest
from fakes import harness
from fakes.media import moving_square_clip

from vostream.apps.userfiles import MAX_NESTING, check_nesting
from vostream.pipeline.errors import ConfigError

DEPTH = 100_000  # 200 KB of brackets each way


def _deep_json() -> str:
    return '{"prompts": ' + "[" * DEPTH + "]" * DEPTH + "}"


def _deep_toml() -> str:
    return "prompts = " + "[" * DEPTH + "]" * DEPTH + "\n"


@pytest.mark.parametrize(
    "name, text, args",
    [
        ("p.json", _deep_json(), ["track", "{clip}", "--prompts", "{file}", "--out", "{out}"]),
        ("c.toml", _deep_toml(), ["track", "{clip}", "--config", "{file}", "--out", "{out}"]),
        ("d.toml", "[[streams]]\nsource = 'x.mp4'\n" + _deep_toml(), ["run", "--config", "{file}"]),
    ],
    ids=["prompts-json", "track-config-toml", "deployment-toml"],
)
def test_a_deeply_nested_file_is_one_line_and_exit_2(tmp_path, name, text, args):
    path = tmp_path / name
    path.write_text(text)
    clip = moving_square_clip(count=4)
    subst = {"clip": str(clip), "file": str(path), "out": str(tmp_path / "o")}
    r = harness.run_cli([a.format(**subst) for a in args])
    assert r.returncode == 2, r.stderr[-1500:]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "nested more than" in lines[0], r.stderr[-1500:]


def test_the_nesting_check_is_iterative_and_exact():
    ok: object = []
    for _ in range(MAX_NESTING - 1):
        ok = [ok]
    assert check_nesting(ok, "x") is ok  # MAX_NESTING levels: accepted
    with pytest.raises(ConfigError, match="nested more than"):
        check_nesting({"a": [ok]}, "x")
