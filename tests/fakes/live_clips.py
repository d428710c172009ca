"""Clips for the live-feed tests: H.264 with a camera-like GOP, and the ``deform`` scene the RTSP tests serve."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import av
import numpy as np

from fakes.media import media_dir
from vostream.pipeline.reconnect import ReconnectPolicy
from vostream.samples.scenes import render_scene

W, H, FPS, N = 320, 240, 30, 300
#: a reconnect policy that retries fast enough for a test
FAST = ReconnectPolicy(initial_s=0.2, max_s=1.0)


def write_clip(
    path: Path, frames: np.ndarray, fps: int = FPS, gop: int = FPS, fmt: str | None = None
) -> Path:
    """H.264 with a keyframe every ``gop`` frames (a camera-like GOP: a client can join within a second)."""
    with av.open(str(path), "w", format=fmt) as out:
        stream = out.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        stream.options = {"crf": "18", "preset": "veryfast", "g": str(gop), "bf": "0"}
        for img in frames:
            out.mux(stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(img), format="rgb24")))
        out.mux(stream.encode(None))
    return path


@functools.cache
def deform_scene() -> Any:
    """The ``deform`` scene, W x H, N frames (made once per session)."""
    return render_scene("deform", W, H, frames=N)


@functools.cache
def deform_clip() -> Path:
    """:func:`deform_scene` as an H.264 MP4 at FPS (written once per session)."""
    return write_clip(media_dir() / "live_deform.mp4", deform_scene().frames)
