"""Decoding real encoded media made in code (tests/fakes/media.py): containers, codecs, rotation, broken inputs."""

from __future__ import annotations

import shutil
import subprocess
import threading
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
from fakes.media import (
    SQUARE_RGB,
    audio_clip,
    copy_to,
    empty_clip,
    make_frame_dir,
    make_video,
    moving_square_clip,
    moving_square_dir,
    square_frame,
    square_frames,
    square_mask,
)

from vostream.pipeline.errors import ConfigError, SourceError
from vostream.stages.sources import (
    FrameDirSource,
    VideoFileSource,
    is_live_uri,
    natural_key,
    open_source,
    probe,
)

W, H, N = 96, 64, 24

CODECS = [
    (".mp4", "libx264"),
    (".mkv", "libvpx-vp9"),
    (".mkv", "mpeg4"),
    (".webm", "libvpx"),
    (".avi", "mjpeg"),
]


@pytest.mark.parametrize("ext,codec", CODECS, ids=[f"{e[1:]}-{c}" for e, c in CODECS])
def test_decodes_containers_and_codecs(ext: str, codec: str) -> None:
    path = moving_square_clip(ext, codec, count=N, width=W, height=H)
    with VideoFileSource(path) as source:
        assert source.length == N
        frames = list(source)
    assert len(frames) == N
    assert [f.index for f in frames] == list(range(N))
    for f in frames:
        assert f.image.shape == (H, W, 3) and f.image.dtype == np.uint8 and f.image.flags.c_contiguous
        assert f.source_id == path.name and f.capture_time > 0
    # pixel content: close to what was encoded, and the square is where it should be
    for i in (0, N // 2, N - 1):
        diff = np.abs(frames[i].image.astype(int) - square_frame(i, W, H)).mean()
        assert diff < 6, f"frame {i} differs by {diff:.1f} on average"
        inside = frames[i].image[square_mask(i, W, H)].mean(axis=0)
        assert np.abs(inside - SQUARE_RGB).max() < 25
    # pts and time base kept: strictly increasing, 1/25 s apart
    times = [f.time for f in frames]
    assert all(t is not None for t in times)
    assert all(isinstance(f.time_base, Fraction) for f in frames)
    steps = np.diff(np.asarray(times, dtype=float))
    assert np.allclose(steps, 1 / 25, atol=2e-3)
    assert source.stats() == {"frames": N, "corrupt_frames": 0, "truncated": False}


def test_pts_match_pyav_directly() -> None:
    path = moving_square_clip(".mp4", "libx264", count=N, width=W, height=H)
    with av.open(str(path)) as c:
        expected = [(f.pts, f.time_base) for f in c.decode(video=0)]
    got = [(f.pts, f.time_base) for f in VideoFileSource(path)]
    assert got == expected


def test_start_and_max_frames() -> None:
    path = moving_square_clip(".mp4", "libx264", count=N, width=W, height=H)
    source = VideoFileSource(path, start=5, max_frames=4, threads=2)
    frames = list(source)
    assert source.length == 4
    assert [f.index for f in frames] == [0, 1, 2, 3]
    full = list(VideoFileSource(path))
    assert [f.pts for f in frames] == [f.pts for f in full[5:9]]
    assert np.array_equal(frames[0].image, full[5].image)


@pytest.mark.parametrize("rotation", [90, 180, 270])
def test_rotation_metadata_is_applied(rotation: int) -> None:
    plain = moving_square_clip(".mp4", "libx264", count=4, width=W, height=H)
    rotated = moving_square_clip(".mp4", "libx264", count=4, width=W, height=H, rotate=rotation)
    upright = [f.image for f in VideoFileSource(plain)]
    frames = [f.image for f in VideoFileSource(rotated)]
    expected_shape = (W, H, 3) if rotation % 180 else (H, W, 3)
    assert frames[0].shape == expected_shape
    # rotation is counter-clockwise degrees (ffprobe's convention): the same as np.rot90 k times
    for a, b in zip(frames, upright):
        assert np.array_equal(a, np.ascontiguousarray(np.rot90(b, rotation // 90)))
    info = probe(rotated)
    assert (info.width, info.height) == ((H, W) if rotation % 180 else (W, H))
    assert info.rotation % 360 == rotation % 360


@pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="needs the ffmpeg command-line tool")
def test_rotation_matches_ffmpeg_autorotate() -> None:
    path = moving_square_clip(".mp4", "libx264", count=4, width=W, height=H, rotate=90)
    raw = subprocess.run(
        [
            "ffmpeg",
            "-v",
            "error",
            "-i",
            str(path),
            "-frames:v",
            "1",
            "-f",
            "rawvideo",
            "-pix_fmt",
            "rgb24",
            "-",
        ],
        capture_output=True,
        check=True,
    ).stdout
    theirs = np.frombuffer(raw, np.uint8).reshape(W, H, 3)
    ours = VideoFileSource(path).read()
    assert ours is not None
    assert np.abs(ours.image.astype(int) - theirs).mean() < 2


def test_probe() -> None:
    path = moving_square_clip(".webm", "libvpx", count=N, width=W, height=H)
    info = probe(path)
    assert info == (W, H, 25.0, N, "vp8", 0)
    d = moving_square_dir(".png", count=6, width=64, height=48)
    assert probe(d) == (64, 48, 0.0, 6, "images", 0)


# -- broken inputs -----------------------------------------------------------------------------------------------


def test_missing_file() -> None:
    with pytest.raises(SourceError, match="no such file.*nope.mp4"):
        VideoFileSource("/definitely/not/here/nope.mp4")
    with pytest.raises(SourceError, match="no such file"):
        open_source("/definitely/not/here/nope.mp4")
    with pytest.raises(OSError):  # SourceError is an OSError
        probe("/definitely/not/here/nope.mp4")


def test_text_file_is_not_a_video(tmp_path: Path) -> None:
    text = tmp_path / "notes.mp4"
    text.write_text("this is not a video\n" * 50)
    with pytest.raises(SourceError, match=r"notes.mp4.*not a video file") as info:
        VideoFileSource(text).open()
    assert "\n" not in str(info.value)


def test_audio_only_file() -> None:
    with pytest.raises(SourceError, match=r"tone.wav.*no video stream"):
        open_source(audio_clip()).open()


def test_zero_frame_video() -> None:
    with pytest.raises(SourceError, match=r"empty.avi.*no frames"):
        VideoFileSource(empty_clip()).open()
    with pytest.raises(SourceError, match="no frames"):
        probe(empty_clip())


def test_truncated_mp4_without_index_fails_cleanly(tmp_path: Path) -> None:
    path = copy_to(moving_square_clip(".mp4", "libx264", count=N, width=W, height=H), tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # PyAV writes the moov index at the end: nothing is decodable
    with pytest.raises(SourceError, match=path.name):
        list(VideoFileSource(path))


@pytest.mark.parametrize("ext,codec", [(".mkv", "libx264"), (".webm", "libvpx"), (".avi", "mjpeg")])
def test_truncated_file_decodes_the_first_part(tmp_path: Path, ext: str, codec: str) -> None:
    path = copy_to(moving_square_clip(ext, codec, count=48, width=W, height=H), tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    source = VideoFileSource(path)
    frames = list(source)
    assert 5 <= len(frames) < 48
    assert source.stats()["truncated"] is True
    for f in frames[:3]:
        assert np.abs(f.image.astype(int) - square_frame(f.index, W, H)).mean() < 6


def _corrupt_packet(path: Path, packet_no: int, seed: int = 0) -> int:
    """Overwrite the middle half of the payload of the ``packet_no``-th video packet with noise; returns its pts."""
    with av.open(str(path)) as c:
        packets = [(p.pos, p.size, p.pts) for p in c.demux(video=0) if p.size]
    pos, size, pts = packets[packet_no]
    data = bytearray(path.read_bytes())
    noise = np.random.default_rng(seed).integers(0, 256, size // 2, dtype=np.uint8).tobytes()
    data[pos + size // 4 : pos + size // 4 + len(noise)] = noise
    path.write_bytes(bytes(data))
    return int(pts)


@pytest.mark.parametrize(
    "ext,codec", [(".avi", "mjpeg"), (".mkv", "mpeg4"), (".mp4", "libx264"), (".webm", "libvpx")]
)
def test_corrupt_packet_in_the_middle_is_skipped(tmp_path: Path, ext: str, codec: str) -> None:
    path = copy_to(moving_square_clip(ext, codec, count=48, width=W, height=H), tmp_path)
    with av.open(str(path)) as c:
        all_pts = sorted(f.pts for f in c.decode(video=0))
    bad_pts = _corrupt_packet(path, 20)
    source = VideoFileSource(path)
    frames = list(source)
    corrupt = source.stats()["corrupt_frames"]
    # decoding finished, nothing fatal, and the frames after the damage are delivered
    assert len(frames) + corrupt >= 47
    assert frames[-1].pts == all_pts[-1]
    # a skipped frame keeps its index: every delivered frame's index is its position in the undamaged clip
    assert [f.index for f in frames] == [all_pts.index(f.pts) for f in frames]
    assert frames[-1].image.shape == (H, W, 3)
    if codec in ("mjpeg", "mpeg4"):
        # These decoders report the damage, and the last frame follows a clean keyframe (MJPEG is all intra,
        # MPEG-4 has a 12-frame GOP).  H.264/VP8 may conceal it silently and smear it until the next keyframe.
        assert np.abs(frames[-1].image.astype(int) - square_frame(47, W, H)).mean() < 6
        assert corrupt >= 1
        assert bad_pts not in {f.pts for f in frames}


# -- frame directories -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ext", [".jpg", ".png"])
def test_frame_directory(ext: str) -> None:
    d = moving_square_dir(ext, count=6, width=64, height=48)
    source = open_source(str(d), fps=30)
    assert isinstance(source, FrameDirSource)
    frames = list(source)
    assert source.length == 6 and len(frames) == 6
    assert frames[0].image.shape == (48, 64, 3)
    for f in frames:
        tol = 4 if ext == ".jpg" else 0
        assert np.abs(f.image.astype(int) - square_frame(f.index, 64, 48)).mean() <= tol
    assert frames[3].pts == 3 and frames[3].time_base == Fraction(1, 30)
    assert frames[3].time == pytest.approx(0.1)


def test_frame_directory_natural_sort(tmp_path: Path) -> None:
    images = square_frames(3, 32, 24)
    names = ["10.png", "2.png", "1.png"]  # lexical order would be 1, 10, 2
    make_frame_dir(tmp_path, [images[2], images[1], images[0]], names=names)
    (tmp_path / "notes.txt").write_text("ignored")
    frames = list(FrameDirSource(tmp_path))
    assert len(frames) == 3
    for i, f in enumerate(frames):
        assert np.array_equal(f.image, images[i])
    assert sorted(["a10", "a2", "a1b", "A1a"], key=natural_key) == ["A1a", "a1b", "a2", "a10"]


def test_frame_directory_errors(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SourceError, match=f"no images in {empty}"):
        open_source(empty).open()
    mixed = make_frame_dir(
        tmp_path / "mixed",
        [square_frame(0, 32, 24), square_frame(1, 32, 24), square_frame(2, 40, 24)],
        ext=".png",
    )
    source = FrameDirSource(mixed)
    assert source.read() is not None and source.read() is not None
    with pytest.raises(SourceError, match=r"00002.png is 40x24 .* 32x24"):
        source.read()


def test_frame_directory_skips_unreadable_image(tmp_path: Path) -> None:
    d = make_frame_dir(tmp_path / "f", square_frames(3, 32, 24), ext=".png")
    (d / "00001.png").write_bytes(b"garbage")
    source = FrameDirSource(d)
    frames = list(source)
    assert [f.pts for f in frames] == [0, 2]
    assert [f.index for f in frames] == [0, 2]  # the skipped frame leaves a gap, later frames are not shifted
    assert np.array_equal(frames[1].image, square_frame(2, 32, 24))
    assert source.stats()["corrupt_frames"] == 1
    # with start, indices count from the first frame after it
    frames = list(FrameDirSource(d, start=1))
    assert [(f.index, f.pts) for f in frames] == [(1, 2)]


class _FakeAvFrame:
    def __init__(self, pts: int | None, time_base: Fraction = Fraction(1, 25)) -> None:
        self.pts, self.time_base = pts, time_base


def _indexer(cfr: bool, rate: Fraction | None = Fraction(25)) -> VideoFileSource:
    source = VideoFileSource(moving_square_clip(".avi", "mjpeg", count=4, width=W, height=H))
    source._cfr, source._rate = cfr, rate
    return source


def test_video_index_follows_timestamps_across_a_missing_frame() -> None:
    # constant rate: the index comes from pts, so a frame the decoder never delivered leaves a gap
    source = _indexer(cfr=True)
    assert [source._true_index(_FakeAvFrame(p)) for p in (0, 1, 2, 4, 5)] == [0, 1, 2, 4, 5]
    # a skipped corrupt frame reported before the frames that precede it in display order (B-frames): the gap
    # goes where the timestamps jump, also for variable-rate streams (where only counted frames make gaps)
    source = _indexer(cfr=False)
    out = [source._true_index(_FakeAvFrame(0)), source._true_index(_FakeAvFrame(1))]
    source._corrupt += 1  # the decoder rejected the packet of pts 3
    out += [source._true_index(_FakeAvFrame(p)) for p in (2, 4, 5)]
    assert out == [0, 1, 2, 4, 5]
    # variable rate without counted damage: consecutive, whatever the timestamps say
    source = _indexer(cfr=False)
    assert [source._true_index(_FakeAvFrame(p)) for p in (0, 1, 3, 4)] == [0, 1, 2, 3]
    # no timestamps: previous + 1 + the corrupt frames counted since
    source = _indexer(cfr=False, rate=None)
    out = [source._true_index(_FakeAvFrame(None))]
    source._corrupt += 2
    out += [source._true_index(_FakeAvFrame(None)) for _ in range(2)]
    assert out == [0, 3, 4]


def test_video_max_frames_counts_positions_not_deliveries(tmp_path: Path) -> None:
    path = copy_to(moving_square_clip(".avi", "mjpeg", count=24, width=W, height=H), tmp_path)
    _corrupt_packet(path, 2)
    frames = list(VideoFileSource(path, max_frames=6))
    assert [f.index for f in frames] == [0, 1, 3, 4, 5]


# -- dispatch and interrupt --------------------------------------------------------------------------------------


@pytest.mark.parametrize("uri", ["rtsp://cam.local/stream", "http://example.com/a.m3u8", "/dev/video0", "0"])
def test_live_uris_open_live_sources(uri: str) -> None:
    from vostream.stages.sources.live import LiveSource

    assert is_live_uri(uri)
    source = open_source(uri)  # constructed only: nothing connects before open()
    assert isinstance(source, LiveSource) and source.live


def test_open_source_dispatch(tmp_path: Path) -> None:
    path = moving_square_clip(".mp4", "libx264", count=N, width=W, height=H)
    assert isinstance(open_source(path), VideoFileSource)
    assert isinstance(open_source(f"file://{path}"), VideoFileSource)
    with pytest.raises(TypeError, match="no_such_option"):  # explicit keyword parameters: wrong at the call
        open_source(path, no_such_option=1)  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match="fps: not an option of a video file"):
        open_source(path, fps=30)
    with pytest.raises(ConfigError, match="threads: not an option of a frames directory"):
        open_source(tmp_path, threads=2)
    with pytest.raises(ConfigError, match="start and threads: not an option of a live source"):
        open_source("rtsp://example.invalid/cam", start=3, threads=2)
    assert not is_live_uri(str(path))


def test_interrupt_from_another_thread() -> None:
    path = moving_square_clip(".mp4", "libx264", count=N, width=W, height=H)
    source = VideoFileSource(path)
    assert source.read() is not None
    t = threading.Thread(target=source.interrupt)
    t.start()
    t.join()
    assert source.read() is None
    source.close()
    source.close()  # idempotent


def test_make_video_roundtrip_mpeg4_avi(tmp_path: Path) -> None:
    """tests/fakes/media.py itself: an even-sized MPEG-4 AVI encodes and reads back with the right frame count."""
    path = make_video(tmp_path / "x.avi", square_frames(5, 48, 32), fps=10, codec="mpeg4")
    frames = list(VideoFileSource(path))
    assert len(frames) == 5
    assert probe(path).fps == 10.0
