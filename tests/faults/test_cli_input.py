"""What a new user types wrong on the command line gets one line that says what to do (issue 24, items 8 and 16):
a misspelt option is named with the one meant, a point with a space after its comma is shown joined, a point left
of or above the frame gets the bounds message (it was taken for an option), and no error dumps the usage."""

from __future__ import annotations

import pytest
from fakes import harness
from fakes.media import moving_square_clip


@pytest.mark.parametrize(
    "args, says",
    [
        (["--piont", "20,30"], "--piont: did you mean --point?"),
        (["--point", "55,", "40"], "'55, 40': write X,Y without a space (55,40)"),
        (["--point", "-5,-5"], "point (-5, -5) is outside the 96x64 frame"),
        (["--box", "-5,-5,30,30"], "box (-5, -5, 30, 30) is outside the 96x64 frame"),
        (["--point"], "argument --point: expected one argument"),
    ],
    ids=["misspelt-option", "space-in-point", "negative-point", "negative-box", "missing-value"],
)
def test_a_mistyped_command_line_is_one_line_that_says_what_to_do(tmp_path, args, says):
    clip = moving_square_clip(count=4)
    r = harness.run_cli(["track", clip, "--out", tmp_path / "o", *args])
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "usage:" not in r.stderr, r.stderr
    assert says in lines[0], lines[0]
    assert not (tmp_path / "o").exists()


def test_a_misspelt_command_names_the_commands():
    r = harness.run_cli(["trak", "x.mp4"])
    assert r.returncode == 2
    assert "invalid choice: 'trak'" in r.stderr and "'track'" in r.stderr and "usage:" not in r.stderr


def test_an_out_that_is_a_file_says_so(tmp_path):
    clip = moving_square_clip(count=4)
    (tmp_path / "afile").write_text("")
    r = harness.run_cli(["track", clip, "--point", "48,32", "--out", tmp_path / "afile"])
    assert r.returncode == 4
    assert "is a file, not a folder" in r.stderr and "File exists" not in r.stderr, r.stderr


def test_a_mask_png_declaring_billions_of_pixels_is_refused_from_its_header(tmp_path):
    """A 437 KB PNG of 60000x60000 pixels: Pillow's DecompressionBombError was an internal error (exit 70)."""
    from PIL import Image

    bomb = tmp_path / "bomb.png"
    Image.new("1", (60000, 60000)).save(bomb, optimize=True)
    assert bomb.stat().st_size < 1_000_000
    r = harness.run_cli(["track", moving_square_clip(count=4), "--mask", bomb, "--out", tmp_path / "o"])
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "larger than any video frame" in lines[0], r.stderr
