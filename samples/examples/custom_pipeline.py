"""Example: build a pipeline by hand with your own sink, and inject a prompt while it runs.

    python samples/examples/custom_pipeline.py VIDEO X Y

Prints, for every frame, the area and box of object 1 (clicked at X, Y on frame 0).  Halfway through, a second
object is added at the same place with ``send_control`` — the way the viewer adds objects to a live session.
"""

from __future__ import annotations

import sys

from vostream.pipeline import Pipeline
from vostream.pipeline.stage import Sink, SinkSpec
from vostream.pipeline.types import Frame, Prompt
from vostream.stages.postprocess import PostprocessStage
from vostream.stages.preprocess import PreprocessStage
from vostream.stages.sources import open_source, probe
from vostream.stages.track import TrackStage
from vostream.stages.trackers import load_tracker


class PrintSink(Sink[Frame]):
    name = "print"

    def write(self, frame: Frame) -> None:
        result = frame.result
        assert result is not None and result.masks is not None  # postprocess ran
        rows = [
            f"obj {oid}: area {int(m.sum())} box {box.astype(int).tolist()}"
            for oid, m, box, present in zip(result.obj_ids, result.masks, result.boxes, result.present)
            if present
        ]
        print(f"frame {frame.index:4d}  " + ("; ".join(rows) or "no object visible"))

    def close(self) -> None:
        pass


class PrintSinkSpec(SinkSpec[Frame]):
    name = "print"

    def build(self) -> Sink[Frame]:
        return PrintSink()


def main(video: str, x: float, y: float) -> None:
    info = probe(video)
    tracker = load_tracker("classic")
    stages = [
        PreprocessStage(tracker.input_spec),
        TrackStage(tracker, [Prompt(1, 0, [[x, y]], [1])]),
        PostprocessStage(),
    ]
    pipe = Pipeline(open_source(video), stages, [PrintSinkSpec()], name="example")
    pipe.start()
    pipe.send_control(
        Prompt(2, max(1, (info.frames or 2) // 2), [[x, y]], [1])
    )  # applied when that frame comes
    report = pipe.wait()
    print(report.summary())


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(sys.argv[1], float(sys.argv[2]), float(sys.argv[3]))
