"""Prompts from the command line, prompts files and TOML configs: parsing, validation, precedence."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from vostream.apps.cli import build_parser, prompts_from_tokens
from vostream.apps.config import load_config, merge_settings
from vostream.apps.prompts import check_prompt_sequence, load_prompts_file
from vostream.pipeline.errors import ConfigError, PromptError
from vostream.pipeline.types import Prompt, RemoveObject


def tokens(argv):
    args = build_parser().parse_args(["track", "v.mp4", *argv])
    return args.prompt_tokens or []


def test_cli_tokens_group_by_obj_in_order(tmp_path):
    m = np.zeros((20, 30), np.uint8)
    m[5:10, 5:10] = 255
    Image.fromarray(m).save(tmp_path / "m.png")
    ps = prompts_from_tokens(
        tokens(
            [
                "--point",
                "10,20",
                "--neg",
                "12,22",
                "--obj",
                "5",
                "--box",
                "1,2,30,40",
                "--obj",
                "7",
                "--frame",
                "3",
                "--mask",
                str(tmp_path / "m.png"),
                "--obj",
                "1",
                "--frame",
                "9",
                "--point",
                "4,4",
            ]
        )
    )
    assert [(p.obj_id, p.frame_index) for p in ps] == [(1, 0), (5, 0), (7, 3), (1, 9)]
    assert ps[0].points.tolist() == [[10, 20], [12, 22]] and ps[0].labels.tolist() == [1, 0]
    assert ps[1].box == (1, 2, 30, 40)
    assert ps[2].mask.sum() == 25


def test_cli_frame_after_points_starts_a_correction():
    ps = prompts_from_tokens(tokens(["--point", "1,1", "--frame", "10", "--point", "2,2"]))
    assert [(p.obj_id, p.frame_index, p.points.tolist()) for p in ps] == [(1, 0, [[1, 1]]), (1, 10, [[2, 2]])]


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--point", "1"], "expected 2 comma-separated numbers"),
        (["--point", "a,b"], "--point 'a,b'"),
        (["--box", "1,2,3"], "X0,Y0,X1,Y1"),
        (["--box", "5,5,1,1"], "empty"),
        (["--obj", "x", "--point", "1,1"], "--obj 'x'"),
        (["--obj", "2"], "has no --point"),
        (["--mask", "/nonexistent.png"], "no such file"),
    ],
)
def test_cli_prompt_errors(argv, needle):
    with pytest.raises(PromptError, match=None) as err:
        prompts_from_tokens(tokens(argv))
    assert needle in str(err.value)


def write(tmp_path, data, name="p.json"):
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return p


def test_prompts_file_full_schema(tmp_path):
    m = np.zeros((10, 10), np.uint8)
    m[2:4, 2:4] = 1
    Image.fromarray(m).save(tmp_path / "obj3.png")
    p = write(
        tmp_path,
        {
            "prompts": [
                {"obj": 1, "frame": 0, "points": [[5, 5], [6, 6]], "labels": [1, 0]},
                {"obj": 2, "box": [1, 1, 4, 4]},
                {"obj": 3, "frame": 2, "mask": "obj3.png"},
                {"obj": 2, "frame": 4, "remove": True},
            ]
        },
    )
    msgs = load_prompts_file(p)
    assert isinstance(msgs[3], RemoveObject) and msgs[3].obj_id == 2 and msgs[3].frame_index == 4
    assert msgs[0].labels.tolist() == [1, 0] and msgs[1].box == (1, 1, 4, 4) and msgs[2].mask.sum() == 4
    check_prompt_sequence(msgs, 10, 10)


@pytest.mark.parametrize(
    "content, needle",
    [
        ("{not json", "invalid JSON at line 1"),
        ({"prompts": []}, "at least one entry"),
        ({"prompts": [{"obj": "a"}]}, "entry 0: 'obj' must be"),
        ({"prompts": [{"obj": 1, "points": [[1, 2, 3]]}]}, "entry 0: 'points'"),
        ({"prompts": [{"obj": 1, "points": [[1, 2]], "labels": [2]}]}, "'labels'"),
        ({"prompts": [{"obj": 1, "colour": 3}]}, "unknown key"),
        (
            {"prompts": [{"obj": 1, "points": [[1, 1]]}, {"obj": 1, "frame": -1, "points": [[1, 1]]}]},
            "entry 1",
        ),
        ({"prompts": [{"obj": 1, "mask": "missing.png"}]}, "no such file"),
        ({"prompts": [{"obj": 1}]}, "at least one point"),
    ],
)
def test_prompts_file_errors_name_the_entry(tmp_path, content, needle):
    with pytest.raises(PromptError) as err:
        load_prompts_file(write(tmp_path, content))
    assert needle in str(err.value) and "p.json" in str(err.value)


def test_missing_prompts_file():
    with pytest.raises(PromptError, match="no such file"):
        load_prompts_file("/nonexistent/prompts.json")


def test_sequence_checks():
    with pytest.raises(PromptError, match=r"point \(50, 5\) is outside the 40x30 frame"):
        check_prompt_sequence([Prompt(1, 0, [[50, 5]], [1])], 40, 30, "v.mp4")
    with pytest.raises(PromptError, match="only negative points"):
        check_prompt_sequence([Prompt(1, 0, [[5, 5]], [0])], 40, 30)
    with pytest.raises(PromptError, match="cannot remove object 4 at frame 3: unknown object id"):
        check_prompt_sequence([Prompt(1, 0, [[5, 5]], [1]), RemoveObject(4, 3)], 40, 30)
    # a negative-only correction of an existing object is fine, and order is by frame, not by list position
    check_prompt_sequence([Prompt(1, 5, [[5, 5]], [0]), Prompt(1, 0, [[6, 6]], [1])], 40, 30)
    with pytest.raises(PromptError, match="box"):
        check_prompt_sequence([Prompt(1, 0, box=(0, 0, 41, 10))], 40, 30)


def test_config_merge_and_override(tmp_path):
    cfg = tmp_path / "run.toml"
    cfg.write_text(
        'source = "in.mp4"\nout = "o"\nsave = ["json", "png"]\nqueue_size = 3\n'
        "fill_holes = true\n[[prompts]]\nobj = 2\npoints = [[1, 2]]\n[tracker]\nwork_size = [64, 48]\n"
    )
    conf = load_config(cfg)
    s = merge_settings(conf, {"source": None, "out": None, "queue_size": 5, "prompts": []})
    assert s.source == str(tmp_path / "in.mp4") and s.out == str(tmp_path / "o")
    assert s.save == ("json", "png") and s.queue_size == 5 and s.fill_holes is True
    assert s.tracker == {"work_size": [64, 48]}
    assert [p.obj_id for p in s.prompts] == [2]
    s2 = merge_settings(conf, {"prompts": [Prompt(9, 0, [[1, 1]], [1])], "save": "mot"})
    assert [p.obj_id for p in s2.prompts] == [9] and s2.save == ("mot",)


@pytest.mark.parametrize(
    "text, needle",
    [
        ("sorce = 'x'", "unknown key(s) ['sorce']"),
        ("queue_size = 0", "'queue_size' must be an integer >= 1"),
        ("save = ['gif']", "unknown format(s) ['gif']"),
        ("policy = 'fast'", "'policy' must be one of"),
        ("source = [", "invalid TOML"),
    ],
)
def test_config_errors(tmp_path, text, needle):
    cfg = tmp_path / "c.toml"
    cfg.write_text(text + "\nout='o'\n" if "out" not in text else text)
    with pytest.raises(ConfigError) as err:
        merge_settings(load_config(cfg), {})
    assert needle in str(err.value)


def test_missing_source_and_out():
    with pytest.raises(ConfigError, match="no SOURCE"):
        merge_settings(None, {"out": "o"})
    with pytest.raises(ConfigError, match="--out"):
        merge_settings(None, {"source": "v.mp4"})


@pytest.mark.parametrize("obj", [0, 256, 10**9, -1])
def test_object_ids_are_1_to_255_at_every_entry_point(tmp_path, obj):
    """An id that no palette PNG can hold (0 is the background) or that overflows a tracker fails at parse time
    with one clear PromptError, from the Prompt type itself: CLI tokens, prompts files, removals, the facade."""
    with pytest.raises(PromptError, match=r"1\.\.255"):
        Prompt(obj, 0, [[1, 1]], [1])
    with pytest.raises(PromptError, match=r"1\.\.255"):
        RemoveObject(obj, 0)
    with pytest.raises(PromptError, match=r"1\.\.255" if obj >= 0 else "non-negative"):
        prompts_from_tokens(tokens(["--obj", str(obj), "--point", "1,1"]))
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"prompts": [{"obj": obj, "frame": 0, "points": [[1, 1]]}]}))
    with pytest.raises(PromptError, match=r"entry 0: 'obj' .*1\.\.255"):
        load_prompts_file(path)
    assert Prompt(255, 0, [[1, 1]], [1]).obj_id == 255 and Prompt(1, 0, [[1, 1]], [1]).obj_id == 1


def test_a_run_holds_at_most_max_objects(monkeypatch):
    import vostream.apps.prompts as prompts_mod

    monkeypatch.setattr(prompts_mod, "MAX_OBJECTS", 3)
    three = [Prompt(i, i, [[1, 1]], [1]) for i in (1, 2, 3)]
    check_prompt_sequence(three, 40, 30)
    with pytest.raises(PromptError, match="4 objects prompted; a run tracks at most 3"):
        check_prompt_sequence([*three, Prompt(4, 9, [[1, 1]], [1])], 40, 30)
