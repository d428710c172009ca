"""Preprocess arithmetic and buffers; the track stage's prompt scheduling, driven with a recording fake session."""

from __future__ import annotations

import numpy as np
import pytest

from vostream.pipeline.errors import PromptError
from vostream.pipeline.types import Frame, Prompt, RemoveObject, ResetTracker, TrackResult
from vostream.stages.preprocess import Preprocessor, PreprocessStage
from vostream.stages.track import TrackStage
from vostream.stages.trackers.base import InputSpec, Tracker, TrackerSession

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def image(w=64, h=48, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), np.uint8)


@pytest.mark.parametrize("layout", ["HWC", "CHW", "NCHW"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_normalisation_matches_the_formula(layout, dtype):
    img = image(32, 32)
    out = Preprocessor(InputSpec(32, 32, "stretch", MEAN, STD, layout, dtype))(img)
    expected = (img / 255.0 - np.array(MEAN)) / np.array(STD)  # HWC
    if layout != "HWC":
        expected = expected.transpose(2, 0, 1)
    if layout == "NCHW":
        expected = expected[None]
    assert out.dtype == np.dtype(dtype) and out.shape == expected.shape
    np.testing.assert_allclose(out.astype(np.float64), expected, atol=2e-2 if dtype == "float16" else 1e-5)


def test_sizes_fit_and_stretch():
    img = image(854, 480)
    assert Preprocessor(InputSpec(480, 270, "fit"))(img).shape == (270, 480, 3)
    assert Preprocessor(InputSpec(1024, 1024, "stretch", layout="CHW"))(img).shape == (3, 1024, 1024)
    small = image(100, 50)
    out = Preprocessor(InputSpec(480, 270, "fit"))(small)  # fit never upscales
    assert out.shape == (50, 100, 3) and np.array_equal(out, small)


def test_ring_buffers_are_reused_and_reallocated_on_size_change():
    pre = Preprocessor(InputSpec(16, 16, "stretch", dtype="float32"), ring=3)
    outs = [pre(image(40, 30, seed=i)) for i in range(4)]
    assert outs[3] is outs[0] and outs[1] is not outs[0] and outs[2] is not outs[1]
    bigger = Preprocessor(InputSpec(100, 100, "fit"), ring=2)
    a = bigger(image(40, 30))
    b = bigger(image(80, 60))  # new source size: new buffers of the new shape
    assert a.shape == (30, 40, 3) and b.shape == (60, 80, 3)


def test_preprocess_stage_follows_source_size():
    specs = []

    def spec_for(w, h):
        specs.append((w, h))
        return InputSpec(w // 2, h // 2)

    stage = PreprocessStage(spec_for)
    f1 = stage.process(Frame(0, image(64, 48)))
    f2 = stage.process(Frame(1, image(64, 48)))
    f3 = stage.process(Frame(2, image(32, 24)))
    assert specs == [(64, 48), (32, 24)]
    assert (
        f1.tensor.shape == (24, 32, 3) and f2.tensor.shape == (24, 32, 3) and f3.tensor.shape == (12, 16, 3)
    )


class RecordingSession(TrackerSession):
    """Records what the track stage asks, and tracks nothing."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.ids: list[int] = []

    def add_prompt(self, prompt):
        if prompt.obj_id not in self.ids and not len(prompt.positive_points) and prompt.box is None:
            raise PromptError(f"unknown object {prompt.obj_id}")
        self.calls.append(("prompt", prompt.obj_id, prompt.frame_index))
        if prompt.obj_id not in self.ids:
            self.ids.append(prompt.obj_id)

    def remove_object(self, obj_id):
        if obj_id not in self.ids:
            raise PromptError(f"unknown object {obj_id}")
        self.ids.remove(obj_id)
        self.calls.append(("remove", obj_id))

    def reset(self):
        self.ids.clear()
        self.calls.append(("reset",))

    def step(self, frame):
        self.calls.append(("step", frame.index))
        n = len(self.ids)
        return TrackResult(
            frame.index,
            self.ids,
            np.ones(n),
            np.ones(n, bool),
            np.zeros((n, 4)),
            logits=np.ones((n, 4, 4), np.float32),
        )

    @property
    def object_ids(self):
        return list(self.ids)


class FakeTracker(Tracker):
    def __init__(self):
        self.session = RecordingSession()

    def input_spec(self, w, h):
        return InputSpec(4, 4)

    def new_session(self):
        return self.session


def frame(i, w=64, h=48):
    return Frame(i, np.zeros((h, w, 3), np.uint8))


def test_prompts_applied_at_their_frame_in_order_and_late_ones_counted():
    tracker = FakeTracker()
    stage = TrackStage(
        tracker, [Prompt(2, 3, [[5, 5]], [1]), Prompt(1, 0, [[1, 1]], [1]), RemoveObject(1, 3)]
    )
    stage.open()
    for i in (0, 1, 5, 6):  # frames 2-4 were dropped (a live feed): frame-3 messages land on frame 5
        out = stage.process(frame(i))
        assert out.result is not None
    calls = tracker.session.calls
    assert calls == [
        ("prompt", 1, 0),
        ("step", 0),
        ("step", 1),
        ("prompt", 2, 5),
        ("remove", 1),
        ("step", 5),
        ("step", 6),
    ]
    stats = stage.stats()
    assert stats["late_prompts"] == 2 and stats["applied_prompts"] == 2 and stats["objects"] == 1


def test_no_objects_gives_an_empty_result_without_stepping():
    tracker = FakeTracker()
    stage = TrackStage(tracker)
    out = stage.process(frame(0))
    assert len(out.result) == 0 and out.result.masks.shape == (0, 48, 64)
    assert tracker.session.calls == []


def test_injected_bad_prompt_is_rejected_not_fatal_but_upfront_one_is_fatal():
    tracker = FakeTracker()
    stage = TrackStage(tracker, [Prompt(1, 0, [[1, 1]], [1])])
    assert stage.handle_control(Prompt(1, 1, [[500, 5]], [1]))  # outside the 64x48 frame
    assert stage.handle_control(Prompt(7, 1, [[5, 5]], [0]))  # negative-only for an unknown object
    assert not stage.handle_control("not a prompt")
    stage.process(frame(0))
    stage.process(frame(1))
    assert stage.stats()["rejected_prompts"] == 2
    bad = TrackStage(FakeTracker(), [Prompt(1, 0, [[500, 5]], [1])])
    with pytest.raises(PromptError, match="outside the 64x48 frame"):
        bad.process(frame(0))


def test_reset_and_unapplied_prompts_reported_at_finish():
    tracker = FakeTracker()
    stage = TrackStage(tracker, [Prompt(1, 0, [[1, 1]], [1]), ResetTracker(2), Prompt(3, 99, [[1, 1]], [1])])
    for i in range(4):
        stage.process(frame(i))
    assert ("reset",) in tracker.session.calls and stage.stats()["objects"] == 0
    assert list(stage.finish()) == []
    assert stage.stats()["unapplied_prompts"] == 1 and stage.unapplied[0].obj_id == 3
