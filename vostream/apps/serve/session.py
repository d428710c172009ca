"""Viewer sessions: one :class:`~vostream.pipeline.Pipeline` per opened source, driven by the viewer's controls.

- :class:`ControllableSource` wraps a file or frames-directory source: it starts paused showing frame 0, plays at
  the source's frame rate, pauses by holding ``read()``, steps one frame, seeks by reopening the source at frame N,
  replays the frame on screen (so a prompt given on a paused frame shows its mask at once), and holds at the end
  of the file instead of ending the stream (the user can still seek back, correct and export).
- :class:`Session`: the pipeline (source → preprocess → track → postprocess → viewer sink + optional file sinks),
  its clients' :class:`~vostream.sinks.websocket.FrameHub`, the objects the viewer created, and exports.

Thread-safety: every public method of :class:`Session` and :class:`ControllableSource` may be called from any
thread (the server's event loop calls them); they only set state under a lock and never block on the pipeline,
except :meth:`Session.open` and :meth:`Session.export` (run them in a worker thread) and :meth:`Session.close`
(waits up to a few seconds for the pipeline to end).
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vostream.apps.assemble import assemble_track
from vostream.apps.serve.protocol import PromptMsg, ProtocolError, check_prompt_range
from vostream.pipeline.engine import ControlReceipt, Pipeline
from vostream.pipeline.errors import ConfigError, VostreamError
from vostream.pipeline.stage import SinkSpec, Source
from vostream.pipeline.types import Control, Frame, Prompt, RemoveObject, ResetTracker, Rle, TrackResult
from vostream.sinks import build_file_sinks
from vostream.sinks.png import PngSinkSpec
from vostream.sinks.vis_json import VisJsonSinkSpec
from vostream.sinks.websocket import AnnotationRecord, FrameHub, ViewerSinkSpec, decode_rle_counts
from vostream.stages.sources import FrameDirSource, is_live_uri, open_source
from vostream.stages.trackers import Tracker, load_tracker
from vostream.stages.trackers.reload import ModelHandle, ReloadableTracker, ReloadOutcome

logger = logging.getLogger(__name__)


def _no_factory(start: int) -> Source[Frame]:
    raise ConfigError("this session has ended; open the source again")


class ControllableSource(Source[Frame]):
    """A file source under the viewer's control (see the module docstring).  ``factory(start)`` returns a new,
    opened inner source whose first frame is frame ``start``; frame indices are made absolute.

    Live sources (``live`` True) start playing and are never paced (the feed paces itself).  Pause freezes the
    display on the frame on screen while ``read()`` keeps draining the feed and dropping its frames (latency stays
    bounded; the tracker sees the index gap when play resumes); step releases the newest frame; a prompt on the
    frozen frame replays it like on a file.  No seek.
    """

    def __init__(
        self,
        factory: Callable[[int], Source[Frame]],
        first: Source[Frame],
        *,
        fps: float,
        length: int | None,
        live: bool = False,
        on_state: Callable[[], None] | None = None,
    ) -> None:
        self._factory = factory
        self._inner: Source[Frame] | None = first
        self.period = 1.0 / fps if fps and fps > 0 else 1.0 / 25.0
        self.length = length
        self.live = live
        self.name = getattr(first, "name", "source")
        self.on_state = on_state or (lambda: None)
        self._cond = threading.Condition()
        self.playing = live
        self.ended = False
        self._budget = 1  # frames to release while paused: the first frame is shown
        self._seek_to: int | None = None
        self._replay = False
        self._finish = False
        self._stop = False
        self._offset = 0
        self._last: Frame | None = None
        self._next_due = 0.0
        self.index = -1  # last frame released
        self.drained = 0  # live frames read and dropped while paused

    # -- controls (any thread) -----------------------------------------------------------------------------
    def play(self) -> None:
        with self._cond:
            if not self.ended:
                self.playing = True
                self._next_due = time.monotonic()
            self._cond.notify_all()

    def pause(self) -> None:
        with self._cond:
            self.playing = False
            self._budget = 0
            self._cond.notify_all()

    def step(self) -> None:
        with self._cond:
            if not self.playing and not self.ended:
                self._budget += 1
            self._cond.notify_all()

    def seek(self, frame: int) -> None:
        with self._cond:
            self._seek_to = frame
            self.playing = False
            self._cond.notify_all()

    def replay(self) -> None:
        """Send the frame on screen through the pipeline again (after a prompt on a paused frame)."""
        with self._cond:
            if self._last is not None:
                self._replay = True
                self._cond.notify_all()

    def finish(self) -> None:
        """End the stream (the pipeline drains and closes)."""
        with self._cond:
            self._finish = True
            self._cond.notify_all()

    # -- Source ----------------------------------------------------------------------------------------------
    def open(self) -> None:
        if self._inner is not None:
            self._inner.open()

    def _copy_last(self) -> Frame:
        last = self._last
        assert last is not None
        return Frame(last.index, last.image, last.pts, last.time_base, time.time(), last.source_id)

    def read(self) -> Frame | None:
        while True:
            target: int | None
            with self._cond:
                while True:
                    if self._stop or self._finish:
                        return None
                    if self._seek_to is not None:
                        target, self._seek_to = self._seek_to, None
                        break
                    if self._replay:
                        self._replay = False
                        return self._copy_last()
                    now = time.monotonic()
                    if not self.ended and (
                        self._budget > 0 or (self.playing and (self.live or now >= self._next_due))
                    ):
                        target = None
                        break
                    if self.live:  # paused live feed: drain it (below), never let it queue up in the socket
                        target = -1
                        break
                    wait = self._next_due - now if self.playing and not self.ended else 0.5
                    self._cond.wait(max(0.001, min(wait, 0.5)))
            if target == -1:
                dropped = self._inner.read() if self._inner is not None else None
                if dropped is None:
                    return None
                with self._cond:
                    self.drained += 1
                continue
            if target is not None:
                self._do_seek(target)
                continue
            frame = self._inner.read() if self._inner is not None else None
            with self._cond:
                if frame is None:
                    if self.live or self._stop:
                        return None
                    self.ended, self.playing, self._budget = True, False, 0
                    changed = True
                else:
                    frame.index += self._offset
                    self._last = frame
                    self.index = frame.index
                    if self._budget > 0:
                        self._budget -= 1
                    now = time.monotonic()
                    self._next_due = max(self._next_due + self.period, now - self.period)
                    changed = False
            if changed:
                self.on_state()
                continue
            return frame

    def _do_seek(self, target: int) -> None:
        old, self._inner = self._inner, None
        if old is not None:
            old.close()
        inner = self._factory(target)
        inner.open()
        with self._cond:
            self._inner = inner
            self._offset = target
            self.ended = False
            self._budget = 1
        self.on_state()

    def interrupt(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._inner is not None:
            self._inner.interrupt()

    def close(self) -> None:
        if self._inner is not None:
            self._inner.close()

    def release(self) -> None:
        """After the pipeline has ended: close and drop the inner source, the frame on screen and the callbacks
        (which point back at the session), so the decoder and its threads go at once.  Idempotent."""
        with self._cond:
            self._stop = True
            inner, self._inner = self._inner, None
            self._last = None
            self.on_state = lambda: None
            self._factory = _no_factory
        if inner is not None:
            inner.close()

    def stats(self) -> dict[str, Any]:
        inner = self._inner.stats() if self._inner is not None else {}
        return {
            **inner,
            "index": self.index,
            "playing": int(self.playing),
            "ended": int(self.ended),
            "paused_drops": self.drained,
        }


class TrackerCache:
    """One loaded tracker shared by every session of a server: weights / graphs load once (about a second for an
    exported SAM 2 model), not per browser session.  Each session still gets its own :class:`TrackerSession`
    (for the SAM-2 backends, its own device buffers; calls take turns on the shared runtime).  The tracker sits in a
    :class:`ModelHandle`: :meth:`reload` replaces it under running sessions (``docs/deploy.md`` §2).  Thread-safe."""

    def __init__(self, backend: str, options: Mapping[str, object]) -> None:
        self.backend = backend
        self.options = dict(options)
        self._lock = threading.Lock()
        self.handle: ModelHandle | None = None
        self._closed = False

    @property
    def model(self) -> str:
        return str(self.options.get("model") or self.backend)

    def get(self, label: str = "") -> Tracker:
        """The shared model as session ``label`` sees it (its sessions follow reloads).  Loads it the first time."""
        with self._lock:
            if self._closed:
                raise ConfigError("the server is shutting down")
            if self.handle is None:
                self.handle = ModelHandle(load_tracker(self.backend, **self.options), model=self.model)
            return ReloadableTracker(self.handle, label)

    def reload(self) -> ReloadOutcome:
        """Load the model again (a new export in ``--model``'s directory) beside the running one, check it and
        switch every session to it at its next frame.  Blocking.  Raises ``ReloadError`` when it is refused (the
        running model stays).  Before the first session nothing is loaded: the model is loaded now."""
        with self._lock:
            handle = self.handle
        if handle is None:
            t0 = time.perf_counter()
            self.get()
            return ReloadOutcome(1, time.perf_counter() - t0, 0.0, self.model)
        return handle.reload(lambda: load_tracker(self.backend, **self.options), model=self.model)

    def forget(self, label: str) -> None:
        """Drop an ended session's reload figures."""
        handle = self.handle
        if handle is not None:
            handle.forget(label)

    def close(self) -> None:
        """Release every loaded model.  Idempotent; later :meth:`get` calls are refused."""
        with self._lock:
            self._closed = True
            handle, self.handle = self.handle, None
        if handle is not None:
            handle.close()


@dataclass
class SessionOptions:
    """What every session of a server shares."""

    backend: str = "classic"
    tracker_options: dict[str, object] = field(default_factory=dict)
    max_objects: int = 8
    jpeg_quality: int = 80
    fps: float = 25.0  # frames directories (no rate of their own)
    out_dir: str | None = None  # when set, each session also writes file sinks under out_dir/<session>/
    save: tuple[str, ...] = ("json", "mot")
    queue_size: int = (
        1  # interactive: a short pipeline keeps glass-to-glass latency low (block edges stay lossless)
    )

    def __post_init__(self) -> None:
        """Every value is checked here, so no server can be built with a bad one (``--max-objects 0``)."""
        if not 1 <= self.max_objects <= 255:
            raise ConfigError(f"max objects must be 1..255 (one PNG label each), got {self.max_objects}")
        if not 1 <= self.jpeg_quality <= 100:
            raise ConfigError(f"JPEG quality must be 1..100, got {self.jpeg_quality}")
        if not (self.fps > 0 and self.fps < 1000):
            raise ConfigError(f"fps must be > 0 and < 1000, got {self.fps}")
        if self.queue_size < 1:
            raise ConfigError(f"queue size must be >= 1, got {self.queue_size}")


class Session:
    """One opened source and its pipeline.  ``notify(kind)`` is called (from pipeline threads) with ``"state"``
    when playback state changes and ``"end"`` when the pipeline ended (``self.error`` holds a failure)."""

    def __init__(
        self,
        source: str,
        display: str,
        options: SessionOptions,
        notify: Callable[[str], None] | None,
        trackers: TrackerCache,
    ) -> None:
        self.trackers = trackers  # the server's tracker, shared by its sessions; the server releases it
        self.id = secrets.token_urlsafe(6)
        self.source_path = source
        self.display = display
        self.options = options
        self.notify = notify or (lambda kind: None)
        self.width = self.height = 0
        self.fps = 0.0
        self.frames: int | None = None
        self.live = False
        self.objects: set[int] = set()
        self.error: str | None = None
        self.ended = False
        self.last_active = time.monotonic()  # the owner's last message (the server's idle timeout)
        self.export_dir: Path | None = None
        self.exports: dict[str, Path] = {}
        self._lock = threading.Lock()
        self.pipeline: Pipeline | None = None
        self.control: ControllableSource | None = None
        self._watcher: threading.Thread | None = None

        self.hub = FrameHub()
        self.record = AnnotationRecord()

    # -- lifecycle ---------------------------------------------------------------------------------------------
    def open(self) -> None:
        """Open the source and start the pipeline (blocking: run in a worker thread).  Raises
        :class:`VostreamError` subclasses (``SourceError`` for a bad file)."""
        path = self.source_path
        self.live = is_live_uri(path)
        is_dir = os.path.isdir(path)

        def factory(start: int) -> Source[Frame]:
            src = open_source(
                path,
                source_id=self.display,
                start=0 if self.live else start,
                fps=self.options.fps if is_dir else None,
            )
            src.open()
            return src

        first = factory(0)
        try:
            self._start(first, factory)
        except BaseException:
            if self.pipeline is None:  # not started: nothing else will close the decoder
                first.close()
            raise

    def _start(self, first: Source[Frame], factory: Callable[[int], Source[Frame]]) -> None:
        self.width, self.height = int(getattr(first, "width")), int(getattr(first, "height"))  # noqa: B009
        self.fps = float(getattr(first, "fps", 0.0) or self.options.fps)
        self.frames = first.length
        if isinstance(first, FrameDirSource):
            self.fps = self.options.fps
        self.control = ControllableSource(
            factory,
            first,
            fps=self.fps,
            length=self.frames,
            live=self.live,
            on_state=lambda: self.notify("state"),
        )
        supervisor = getattr(first, "supervisor", None)
        if (
            supervisor is not None
        ):  # a live feed: its state changes (reconnecting, running, ...) reach the clients
            supervisor.add_listener(lambda event: self.notify("state"))
        tracker = self.trackers.get(self.id)  # shared by the server's sessions: the server releases it
        sinks: list[SinkSpec[Frame]] = [
            ViewerSinkSpec(
                self.hub,
                session=self.id,
                jpeg_quality=self.options.jpeg_quality,
                record=None if self.live else self.record,
            )
        ]
        if self.options.out_dir:
            sinks += build_file_sinks(
                Path(self.options.out_dir) / self.id,
                self.options.save,
                fps=self.fps,
                source_name=self.display,
            )
        self.pipeline = assemble_track(
            self.control, tracker, sinks, queue_size=self.options.queue_size, name=f"session-{self.id}"
        )
        self.pipeline.start()
        self._watcher = threading.Thread(target=self._watch, daemon=True, name=f"vostream-session-{self.id}")
        self._watcher.start()

    def _watch(self) -> None:
        assert self.pipeline is not None
        try:
            self.pipeline.wait()
        except VostreamError as exc:
            self.error = str(exc)
            logger.warning("session %s (%s) failed: %s", self.id, self.display, exc)
        except Exception as exc:  # noqa: BLE001 - reported to the clients, not raised into a dead thread
            self.error = f"{type(exc).__name__}: {exc}"
        self.ended = True
        self.notify("end")

    def close(self, timeout: float = 5.0) -> None:
        """Stop the pipeline (cancel), wait up to ``timeout`` s, remove exports, then release everything the
        session holds (decoders and their threads, the tracker session, frames) at once: the references between
        the session, its source and its callbacks are cut, so nothing waits for a garbage-collector cycle.
        Idempotent."""
        pipeline = self.pipeline
        stopped = True
        if pipeline is not None:
            pipeline.cancel()
            try:
                pipeline.wait(timeout)
            except TimeoutError:
                stopped = False
                logger.warning("session %s did not stop within %.1f s", self.id, timeout)
            except VostreamError:
                pass
            watcher = self._watcher
            if watcher is not None and watcher is not threading.current_thread():
                watcher.join(timeout)
        if self.export_dir is not None:
            shutil.rmtree(self.export_dir, ignore_errors=True)
            self.export_dir = None
        if stopped:
            self._release()

    def _release(self) -> None:
        """Drop the pipeline, the source and the callbacks (they point back at this session)."""
        self.ended = True
        self.notify = lambda kind: None
        control, self.control = self.control, None
        if control is not None:
            control.release()
        self.pipeline = None
        self.hub.clear()
        self.record = AnnotationRecord()
        self.exports.clear()
        self.trackers.forget(self.id)

    # -- controls ---------------------------------------------------------------------------------------------
    def _src(self) -> ControllableSource:
        if self.control is None or self.pipeline is None or self.ended:
            raise ProtocolError("no_session", "this session has ended; open a source again")
        return self.control

    def _file_only(self, what: str) -> ControllableSource:
        src = self._src()
        if src.live:
            raise ProtocolError(
                "unsupported", f"{what} needs a file or frames directory, not a live stream", what
            )
        return src

    def play(self) -> None:
        self._src().play()

    def pause(self) -> None:
        self._src().pause()  # live: freezes the display, the feed is drained meanwhile

    def step(self) -> None:
        self._src().step()

    def seek(self, frame: int) -> None:
        src = self._file_only("seek")
        if self.frames is not None and frame >= self.frames:
            raise ProtocolError(
                "out_of_range",
                f"seek.frame {frame} is past the end ({self.frames} frames, 0..{self.frames - 1})",
                "seek",
            )

        assert self.pipeline is not None
        self.pipeline.send_control(ResetTracker(frame))
        with self._lock:
            self.objects.clear()
        src.seek(frame)

    def _target_frame(self, requested: int) -> tuple[int, bool]:
        """The frame a control lands on and whether the paused frame must be replayed."""
        src = self._src()
        paused = not src.playing
        if paused:
            return max(src.index, 0), src.index >= 0
        return requested, False

    def prompt(self, p: PromptMsg) -> None:
        src = self._src()
        check_prompt_range(p, self.width, self.height)
        if src.index >= 0 and p.frame > src.index:
            raise ProtocolError(
                "out_of_range",
                f"prompt.frame {p.frame} has not been shown yet (last frame {src.index})",
                "prompt",
            )
        with self._lock:
            new = p.obj not in self.objects
            if new and len(self.objects) >= self.options.max_objects:
                raise ProtocolError(
                    "too_many_objects",
                    f"at most {self.options.max_objects} objects per session; remove one first",
                    "prompt",
                )
            if new and p.box is None and 1 not in p.labels:
                raise ProtocolError(
                    "unknown_object",
                    f"object {p.obj} is not tracked yet: start it with a positive click or a box",
                    "prompt",
                )
            self.objects.add(p.obj)
        frame, replay = self._target_frame(p.frame)
        pts = np.asarray(p.points, np.float32).reshape(-1, 2)
        prompt = Prompt(p.obj, frame, pts, list(p.labels), p.box, None)
        assert self.pipeline is not None
        receipt = self.pipeline.send_control(prompt)
        if replay:
            self._replay_after(receipt)

    def remove(self, obj: int) -> None:
        self._src()
        with self._lock:
            if obj not in self.objects:
                raise ProtocolError(
                    "unknown_object",
                    f"object {obj} is not tracked; known: {sorted(self.objects) or 'none'}",
                    "remove",
                )
            self.objects.discard(obj)
        self._control_now(lambda f: RemoveObject(obj, f))

    def reset(self) -> None:
        self._src()
        with self._lock:
            self.objects.clear()
        self._control_now(ResetTracker)

    def _control_now(self, make: Callable[[int], Control]) -> None:
        src = self._src()
        frame, replay = self._target_frame(max(src.index, 0))
        assert self.pipeline is not None
        receipt = self.pipeline.send_control(make(frame))
        if replay:
            self._replay_after(receipt)

    def _replay_after(self, receipt: ControlReceipt) -> None:
        """Replay the paused frame once every stage has taken the control message (an idle stage takes it
        within one queue poll), so the replayed frame cannot overtake it.  Never blocks the caller."""
        src = self._src()

        def run() -> None:
            receipt.wait(2.0)
            src.replay()

        threading.Thread(target=run, daemon=True, name=f"vostream-replay-{self.id}").start()

    # -- state, stats, export ------------------------------------------------------------------------------
    def state(self) -> dict[str, object]:
        src = self.control
        with self._lock:
            objects = sorted(self.objects)
        out = {
            "t": "state",
            "playing": bool(src and src.playing),
            "ended": bool(src and src.ended),
            "index": src.index if src else -1,
            "frames": self.frames,
            "objects": objects,
            "watchers": max(0, len(self.hub) - 1),
        }
        if self.live:
            out["source"] = self.source_stats()
        return out

    def source_stats(self) -> dict[str, object]:
        """A live feed's supervisor figures (``docs/live.md``): ``state`` (connecting, running, stalled,
        reconnecting, ended), ``reconnects``, ``disconnects``, ``stalls``, ``frames``, ``paused_drops``; ``{}`` for
        files."""
        src = self.control
        if src is None or not self.live:
            return {}
        stats = src.stats()
        return {
            k: stats[k]
            for k in ("state", "reconnects", "disconnects", "stalls", "frames", "paused_drops")
            if k in stats
        }

    def opened(self, watcher: bool) -> dict[str, object]:
        return {
            "t": "opened",
            "session": self.id,
            "source": self.display,
            "width": self.width,
            "height": self.height,
            "fps": self.fps,
            "frames": self.frames,
            "seekable": not self.live,
            "live": self.live,
            "watcher": watcher,
        }

    def export(self, fmt: str) -> tuple[Path, int]:
        """Write the annotations recorded so far as ``annotations.json`` (YouTube-VIS, COCO RLE) or ``masks.zip``
        (DAVIS palette PNGs) with the file sinks' own code.  Blocking: run in a worker thread."""
        if self.live:
            raise ProtocolError("unsupported", "export needs a file or frames-directory session", "export")

        items = self.record.items()
        if not items:
            raise ProtocolError("out_of_range", "nothing to export yet: no frame has been tracked", "export")
        if self.export_dir is None:
            self.export_dir = Path(tempfile.mkdtemp(prefix=f"vostream-export-{self.id}-"))
        work = Path(tempfile.mkdtemp(dir=self.export_dir))
        spec: SinkSpec[Frame] = (
            VisJsonSinkSpec(work / "annotations.json", video_name=self.display)
            if fmt == "json"
            else PngSinkSpec(work / "masks")
        )
        sink = spec.build()
        try:
            sink.open()
            for index, rec in items:
                ids = [r[0] for r in rec.rows]
                masks = np.zeros((len(ids), rec.height, rec.width), bool)
                rles: list[Rle] = []
                for i, r in enumerate(rec.rows):
                    if r[4] is not None:
                        masks[i] = decode_rle_counts(r[4], rec.height, rec.width)
                    rles.append({"size": [rec.height, rec.width], "counts": r[4] or ""})
                result = TrackResult(
                    index,
                    np.asarray(ids),
                    np.asarray([r[1] for r in rec.rows]),
                    np.asarray([r[2] for r in rec.rows]),
                    np.asarray([r[3] for r in rec.rows]),
                    masks=masks,
                    rles=rles,
                )
                image = np.broadcast_to(np.zeros((1, 1, 3), np.uint8), (rec.height, rec.width, 3))
                sink.write(Frame(index, image, source_id=self.display, result=result))
        finally:
            sink.close()
        if fmt == "json":
            target = self.export_dir / "annotations.json"
            os.replace(work / "annotations.json", target)
        else:
            target = self.export_dir / "masks.zip"
            tmp = target.with_suffix(".partial")
            with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as z:
                for png in sorted((work / "masks").glob("*.png")):
                    z.write(png, f"masks/{png.name}")
            os.replace(tmp, target)
        shutil.rmtree(work, ignore_errors=True)
        self.exports[fmt] = target
        return target, len(items)


__all__ = ["ControllableSource", "Session", "SessionOptions"]
