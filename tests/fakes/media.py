"""Test media made in code: encoded clips (PyAV), frame directories, audio-only and broken files.

Shared by every test module.  The ``*_clip`` helpers are ``functools.cache``d per session and write into one
temporary directory removed at exit, so a clip is encoded once however many tests use it; treat the returned
paths as read-only (copy a clip before damaging it: :func:`copy_to`).

Synthetic scene: a mid-grey background with a horizontal gradient, a coloured square moving right by ``step``
pixels per frame; :func:`square_mask` gives its exact ground-truth mask.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

#: the moving square's colour (RGB) and side
SQUARE_RGB = (220, 40, 40)

_CONTAINER_FOR_EXT = {".mp4": "mp4", ".mkv": "matroska", ".webm": "webm", ".avi": "avi", ".mov": "mov"}
_PIX_FMT = {"mjpeg": "yuvj420p", "ffv1": "yuv444p"}
_BIT_RATE = {"mpeg4": 4_000_000, "libvpx": 4_000_000, "libvpx-vp9": 4_000_000}


@functools.cache
def media_dir() -> Path:
    """The session's media directory (created once, removed at interpreter exit)."""
    path = Path(tempfile.mkdtemp(prefix="vostream-media-"))
    atexit.register(shutil.rmtree, path, True)
    return path


def square_box(
    index: int, width: int, height: int, size: int | None = None, step: int = 4
) -> tuple[int, int, int, int]:
    """(x0, y0, x1, y1) exclusive box of the moving square on frame ``index``."""
    size = size or max(4, min(width, height) // 4)
    x0 = (8 + index * step) % max(1, width - size)
    y0 = (height - size) // 2
    return x0, y0, x0 + size, y0 + size


def square_mask(index: int, width: int, height: int, size: int | None = None, step: int = 4) -> np.ndarray:
    """Boolean (H, W) ground-truth mask of the square on frame ``index``."""
    x0, y0, x1, y1 = square_box(index, width, height, size, step)
    mask = np.zeros((height, width), bool)
    mask[y0:y1, x0:x1] = True
    return mask


def square_frame(index: int, width: int, height: int, size: int | None = None, step: int = 4) -> np.ndarray:
    """RGB uint8 (H, W, 3) frame ``index`` of the moving-square scene."""
    ramp = np.linspace(60, 140, width, dtype=np.float32).astype(np.uint8)
    image = np.empty((height, width, 3), np.uint8)
    image[:] = ramp[None, :, None]
    image[square_mask(index, width, height, size, step)] = SQUARE_RGB
    return image


def square_frames(
    count: int, width: int, height: int, size: int | None = None, step: int = 4
) -> list[np.ndarray]:
    return [square_frame(i, width, height, size, step) for i in range(count)]


def make_video(
    path: str | Path,
    frames: Iterable[np.ndarray],
    fps: int = 25,
    codec: str = "libx264",
    container: str | None = None,
    rotate: int | None = None,
    pix_fmt: str | None = None,
    options: dict[str, str] | None = None,
) -> Path:
    """Encode RGB uint8 ``frames`` into ``path`` with PyAV; ``rotate`` writes display-matrix rotation metadata
    (degrees counter-clockwise, as ffprobe shows it).  The container format follows the suffix unless given.
    Returns ``path``."""
    path = Path(path)
    fmt = container or _CONTAINER_FOR_EXT.get(path.suffix.lower())
    frames = iter(frames)
    first = next(frames)
    height, width = first.shape[:2]
    with av.open(str(path), "w", format=fmt) as out:
        stream = out.add_stream(codec, rate=Fraction(fps))
        stream.width, stream.height = width, height
        stream.pix_fmt = pix_fmt or _PIX_FMT.get(codec, "yuv420p")
        if codec in _BIT_RATE:  # their defaults (200-256 kb/s) smear small synthetic frames
            stream.bit_rate = _BIT_RATE[codec]
        defaults = {"preset": "ultrafast"} if codec == "libx264" else {}
        if defaults or options:
            stream.options = {**defaults, **(options or {})}
        late_rotation = bool(rotate) and not hasattr(stream, "set_display_rotation")  # PyAV < 16
        if rotate and not late_rotation:
            stream.set_display_rotation(rotate)
        for i, image in enumerate(_chain(first, frames)):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
            frame.pts = i
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    if late_rotation:  # the same display matrix, written by ffmpeg's muxer (stream copy)
        tmp = path.with_name(path.stem + ".unrotated" + path.suffix)
        path.replace(tmp)
        subprocess.run(
            [
                "ffmpeg",
                "-v",
                "error",
                "-y",
                "-i",
                str(tmp),
                "-c",
                "copy",
                "-metadata:s:v:0",
                f"rotate={rotate % 360}",
                str(path),
            ],
            check=True,
        )
        tmp.unlink()
    return path


def _chain(first: np.ndarray, rest: Iterable[np.ndarray]) -> Iterable[np.ndarray]:
    yield first
    yield from rest


def make_empty_video(path: str | Path) -> Path:
    """An AVI with one MJPEG video stream and zero frames."""
    path = Path(path)
    out = av.open(str(path), "w", format="avi")
    stream = out.add_stream("mjpeg", rate=25)
    stream.width, stream.height, stream.pix_fmt = 64, 48, "yuvj420p"
    out.start_encoding()
    out.close()
    return path


def make_audio(path: str | Path, seconds: float = 0.5, rate: int = 16000) -> Path:
    """An audio-only WAV (a 440 Hz tone)."""
    path = Path(path)
    with av.open(str(path), "w", format="wav") as out:
        stream = out.add_stream("pcm_s16le", rate=rate)
        stream.layout = "mono"
        n = int(seconds * rate)
        samples = (np.sin(2 * np.pi * 440 * np.arange(n) / rate) * 8000).astype(np.int16)[None, :]
        frame = av.AudioFrame.from_ndarray(samples, format="s16", layout="mono")
        frame.sample_rate = rate
        frame.pts = 0
        for packet in stream.encode(frame):
            out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return path


def make_frame_dir(
    path: str | Path, frames: Sequence[np.ndarray], ext: str = ".jpg", names: Sequence[str] | None = None
) -> Path:
    """Write ``frames`` as images (``00000.jpg`` ... or the given ``names``) into directory ``path``."""
    from PIL import Image

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    for i, image in enumerate(frames):
        name = names[i] if names is not None else f"{i:05d}{ext}"
        Image.fromarray(image).save(path / name, quality=95) if name.lower().endswith(
            (".jpg", ".jpeg")
        ) else Image.fromarray(image).save(path / name)
    return path


def copy_to(src: str | Path, dst_dir: str | Path, name: str | None = None) -> Path:
    """Copy a cached clip into ``dst_dir`` (so a test may damage its copy)."""
    dst = Path(dst_dir) / (name or Path(src).name)
    shutil.copyfile(src, dst)
    return dst


# -- cached clips ----------------------------------------------------------------------------------------------


@functools.cache
def moving_square_clip(
    ext: str = ".mp4",
    codec: str = "libx264",
    count: int = 24,
    width: int = 96,
    height: int = 64,
    fps: int = 25,
    rotate: int | None = None,
) -> Path:
    """A cached clip of the moving-square scene (see :func:`square_frame`)."""
    name = f"square-{codec}-{count}x{width}x{height}-{fps}-r{rotate or 0}{ext}"
    return make_video(
        media_dir() / name, square_frames(count, width, height), fps=fps, codec=codec, rotate=rotate
    )


@functools.cache
def moving_square_dir(ext: str = ".jpg", count: int = 6, width: int = 64, height: int = 48) -> Path:
    """A cached DAVIS-style frames directory of the moving-square scene."""
    return make_frame_dir(
        media_dir() / f"frames-{ext.strip('.')}-{count}x{width}x{height}",
        square_frames(count, width, height),
        ext=ext,
    )


@functools.cache
def audio_clip() -> Path:
    return make_audio(media_dir() / "tone.wav")


@functools.cache
def empty_clip() -> Path:
    return make_empty_video(media_dir() / "empty.avi")


__all__ = [
    "SQUARE_RGB",
    "audio_clip",
    "copy_to",
    "empty_clip",
    "make_audio",
    "make_empty_video",
    "make_frame_dir",
    "make_video",
    "media_dir",
    "moving_square_clip",
    "moving_square_dir",
    "square_box",
    "square_frame",
    "square_frames",
    "square_mask",
]
