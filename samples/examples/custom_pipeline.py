"""Example: build a pipeline by hand with your own sink, and inject a prompt while it runs.

    python samples/examples/custom_pipeline.py VIDEO X Y

Prints, for every frame, the area and box of object 1 (clicked at X, Y on frame 0).  Halfway through, a second
object is added at the same place with ``send_control`` — the way the viewer adds objects to a live session.
"""

from __future__ import annotations

import sys

import vostream


class PrintSink(vostream.Sink[vostream.Frame]):
    name = "print"

    def write(self, frame: vostream.Frame) -> None:
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


class PrintSinkSpec(vostream.SinkSpec[vostream.Frame]):
    name = "print"

    def build(self) -> vostream.Sink[vostream.Frame]:
        return PrintSink()


def main(video: str, x: float, y: float) -> None:
    info = vostream.probe(video)
    tracker = vostream.load_tracker("classic")
    try:
        pipe = vostream.build_pipeline(
            video, tracker, [PrintSinkSpec()], prompts=[vostream.Prompt(1, 0, [[x, y]], [1])]
        )
        pipe.start()
        # applied when that frame comes
        pipe.send_control(vostream.Prompt(2, max(1, (info.frames or 2) // 2), [[x, y]], [1]))
        report = pipe.wait()
    finally:
        tracker.close()
    print(report.summary())


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(sys.argv[1], float(sys.argv[2]), float(sys.argv[3]))
