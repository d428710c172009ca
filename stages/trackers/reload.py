"""Hot model reload: replace the loaded tracker under running streams without stopping one (``docs/deploy.md`` §2).

- :class:`ModelHandle` holds the tracker every stream uses now and its *generation* number (1 for the first load).
  :meth:`ModelHandle.reload` loads a new tracker **beside** the running one, checks it (:func:`check_tracker`:
  same input as the running model, a synthetic frame tracked twice with finite output) and only then installs it as
  the next generation.  A model that fails to load or to pass the check is refused with one log line and a
  :class:`ReloadError`; the running one is untouched.
- :class:`ReloadableTracker` is what a stream's pipeline sees: an ordinary :class:`Tracker` whose sessions switch to
  the newest generation at a frame boundary.  Once the old model has tracked frame *F*, each object's last mask (its
  result on *F*, at source size) seeds a session of the new model, and the old session is closed:

  - ``seed = "next"`` (the default): the masks are mask prompts on the next frame, which the new session tracks as
    its first frame.  No extra model step anywhere; that frame's result is the carried mask.
  - ``seed = "same"``: the masks are mask prompts on *F* itself and the new session is stepped on *F* at once (its
    output is not used): the memory starts from a mask of the frame it was made on, for the price of one extra step
    of the new model on the switch frame.

  Either way every frame has exactly one result, object ids are kept, and the new model's memory starts from that
  mask (memory banks of two models are not compatible: nothing else carries over).  The old tracker is closed when
  no session uses it any more.  A new model that fails on a stream's frame leaves that stream on the old one.
- A session that tracks nothing switches at once (on the reload, or at its next call): no mask to carry.  An object
  that is not visible at the boundary has no mask to carry: the stream waits up to
  :attr:`ModelHandle.absent_grace_frames` frames for every object to be visible, then switches and leaves out the
  objects still hidden (logged and counted as ``dropped_objects``: prompt them again).

Thread-safety: :class:`ModelHandle` is thread-safe (one reload at a time; a second is refused while one runs).  A
session is driven by one thread at a time, as every :class:`TrackerSession`; its switch runs inside its own
:meth:`~TrackerSession.step`, so on the thread (the scheduler's worker, under ``vostream run``) that drives it.  The
only call from another thread is the idle switch right after a reload, which takes the session's lock without
waiting (a busy session switches at its own next frame instead).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import cv2
import numpy as np

from vostream.pipeline.errors import BackendError, ConfigError, describe
from vostream.pipeline.types import Control, Frame, Prompt, RemoveObject, ResetTracker, TrackResult

from .base import InputSpec, StepAborted, Tracker, TrackerSession

logger = logging.getLogger(__name__)

#: frames a stream waits at a reload for every object to be visible (an object's mask is what carries it over)
ABSENT_GRACE_FRAMES = 30
#: where the last mask of the old model seeds the new one: on the next frame (no extra model step), or on the
#: same frame (one extra step of the new model at the switch; the memory starts from a mask of its own frame)
SEED_MODES = ("next", "same")
#: source sizes at which a new model's input must equal the running model's
_SPEC_PROBES = ((320, 240), (640, 480), (1280, 720), (1920, 1080))


class ReloadError(BackendError):
    """A new model was refused (it did not load, failed the check, or a reload was already under way); the running
    model keeps running."""


class ReloadBusy(ReloadError):
    """A reload was asked for while another one was loading; try again when it has finished."""


@dataclass(frozen=True)
class ReloadOutcome:
    """A reload that was installed: its generation and how long the load and the check took (seconds)."""

    generation: int
    load_s: float
    check_s: float
    model: str = ""

    @property
    def total_s(self) -> float:
        return self.load_s + self.check_s


@dataclass
class StreamSwitches:
    """One stream's view of the reloads (keyed by its label in :attr:`ModelHandle.streams`)."""

    generation: int = 0  # the generation its session runs now
    switches: int = 0
    #: extra work of the last switch: the new session, the masks (and with seed "same" the seeding step), closing
    #: the old session
    last_switch_ms: float = 0.0
    last_switch_frame: int = -1  # the last frame the old model tracked; the next one is the new model's
    dropped_objects: int = 0  # objects not visible within the grace period of a reload, not carried over
    failed_switches: int = 0  # a new model that failed on this stream's frame (the stream kept its old model)


@dataclass
class ReloadStats:
    """What the reloads of one :class:`ModelHandle` did (the deployment's metrics and summary)."""

    reloads: int = 0
    failed: int = 0
    last_load_s: float = 0.0
    last_check_s: float = 0.0
    last_error: str | None = None


@dataclass
class _Generation:
    number: int
    tracker: Tracker
    model: str
    refs: int = 0  # sessions running on it


def describe_spec(spec: InputSpec) -> str:
    """``"128x128 stretch float32 NCHW mean (0.485, ...) std (...)"``: what a tracker takes, for error messages."""
    mean = ", ".join(f"{v:g}" for v in spec.mean)
    std = ", ".join(f"{v:g}" for v in spec.std)
    return f"{spec.width}x{spec.height} {spec.resize} {spec.dtype} {spec.layout} mean ({mean}) std ({std})"


def _check_frame(spec: InputSpec, index: int, width: int, height: int) -> Frame:
    """A ``width`` x ``height`` black frame with a light grey rectangle over its middle half, and the tensor that
    preprocessing makes of it under ``spec`` (built directly: two uniform regions need no resampling)."""
    w, h = spec.output_size(width, height)
    mean, std = np.asarray(spec.mean, np.float64), np.asarray(spec.std, np.float64)
    hwc = np.empty((h, w, 3), np.float32)
    for value, region in ((0, np.s_[:, :]), (200, np.s_[h // 4 : 3 * h // 4, w // 4 : 3 * w // 4])):
        hwc[region] = value if spec.dtype == "uint8" else (value / 255.0 - mean) / std
    tensor = {"HWC": hwc, "CHW": hwc.transpose(2, 0, 1), "NCHW": hwc.transpose(2, 0, 1)[None]}[spec.layout]
    image = np.zeros((height, width, 3), np.uint8)
    image[height // 4 : 3 * height // 4, width // 4 : 3 * width // 4] = 200
    return Frame(index, image, tensor=np.ascontiguousarray(tensor, dtype=spec.dtype))


def check_tracker(
    tracker: Tracker, reference: Tracker | None = None, size: tuple[int, int] = (320, 240)
) -> None:
    """Raise :class:`ReloadError` unless ``tracker`` can replace ``reference`` under running streams.

    Its input (size, normalisation, layout) must equal ``reference``'s at every probe size: frames already
    preprocessed for the running model reach the new one.  Then one session tracks a box on a synthetic frame (a
    grey rectangle on black) and on the next frame: one row for the object, finite logits or masks (this runs every graph of a SAM-2 export: the
    first frame the prompt path, the second the memory path)."""
    if reference is not None:
        for w, h in _SPEC_PROBES:
            new, old = tracker.input_spec(w, h), reference.input_spec(w, h)
            if new != old:
                raise ReloadError(
                    f"the new model takes {describe_spec(new)} input for a {w}x{h} source, the running one "
                    f"{describe_spec(old)}: a reload cannot change the input; restart to change it"
                )
    width, height = size
    spec = tracker.input_spec(width, height)
    session = tracker.new_session()
    try:
        box = (width / 4, height / 4, 3 * width / 4, 3 * height / 4)
        session.add_prompt(Prompt(1, 0, box=box))
        for index in (0, 1):
            result = session.step(_check_frame(spec, index, width, height))
            planes = result.logits if result.logits is not None else result.masks
            if list(result.obj_ids) != [1] or planes is None or planes.ndim != 3 or len(planes) != 1:
                raise ReloadError(
                    f"check step {index} on a synthetic frame: expected one row for object 1, got ids "
                    f"{list(result.obj_ids)} and {'no planes' if planes is None else planes.shape}"
                )
            if not np.all(np.isfinite(np.asarray(planes, np.float32))) or not np.all(
                np.isfinite(result.scores)
            ):
                raise ReloadError(f"check step {index} on a synthetic frame: the model output is not finite")
    finally:
        session.close()


def source_mask(result: TrackResult, row: int, height: int, width: int) -> np.ndarray:
    """Row ``row`` of a tracker's ``result`` as a boolean (height, width) mask at source size: logits resized
    bilinearly and thresholded at 0 (the tracker's own foreground rule), or masks resized by nearest neighbour."""
    if not result.present[row]:
        return np.zeros((height, width), bool)
    if result.logits is not None:
        plane: np.ndarray = np.ascontiguousarray(result.logits[row], np.float32)
        if plane.shape != (height, width):
            plane = cv2.resize(plane, (width, height), interpolation=cv2.INTER_LINEAR)
        return np.asarray(plane > 0)
    if result.masks is not None:
        mask: np.ndarray = np.ascontiguousarray(result.masks[row]).astype(np.uint8)
        if mask.shape != (height, width):
            mask = cv2.resize(mask, (width, height), interpolation=cv2.INTER_NEAREST)
        return np.asarray(mask > 0)
    return np.zeros((height, width), bool)


class ModelHandle:
    """The loaded tracker every stream uses now, and its generation number.

    ``owned``: close the first tracker when it is retired or the handle closes (False when the caller owns it;
    trackers loaded by :meth:`reload` always belong to the handle).  ``absent_grace_frames``: see the module doc."""

    def __init__(
        self,
        tracker: Tracker,
        *,
        model: str = "",
        owned: bool = True,
        absent_grace_frames: int = ABSENT_GRACE_FRAMES,
        seed: str = "next",
    ) -> None:
        if seed not in SEED_MODES:
            raise ConfigError(f"reload seed must be one of {', '.join(SEED_MODES)}, got {seed!r}")
        self.seed = seed
        self._lock = threading.Lock()
        self._reloading = threading.Lock()
        self._gens: dict[int, _Generation] = {1: _Generation(1, tracker, model)}
        self._current = 1
        self._first_owned = owned
        self._closed = False
        self._sessions: weakref.WeakSet[_ReloadableSession] = weakref.WeakSet()
        self.absent_grace_frames = absent_grace_frames
        self.stats = ReloadStats()
        #: per stream label: what its sessions did at the reloads
        self.streams: dict[str, StreamSwitches] = {}

    # -- the current model -----------------------------------------------------------------------------------
    @property
    def generation(self) -> int:
        return self._current

    @property
    def tracker(self) -> Tracker:
        return self._current_generation().tracker

    @property
    def model(self) -> str:
        return self._current_generation().model

    def _current_generation(self) -> _Generation:
        with self._lock:
            if self._closed:
                raise BackendError("the model was closed (the deployment is stopping)")
            return self._gens[self._current]

    def loaded(self) -> list[int]:
        """Generations whose tracker is loaded now: one, or two while streams are switching."""
        with self._lock:
            return sorted(self._gens)

    def acquire(self) -> tuple[int, Tracker]:
        """The current generation and its tracker, counted as used until :meth:`release`."""
        with self._lock:
            if self._closed:
                raise BackendError("the model was closed (the deployment is stopping)")
            gen = self._gens[self._current]
            gen.refs += 1
            return gen.number, gen.tracker

    def release(self, number: int) -> None:
        """One session stopped using generation ``number``; an old generation nobody uses is closed."""
        retire = None
        with self._lock:
            gen = self._gens.get(number)
            if gen is None:
                return
            gen.refs -= 1
            if gen.refs <= 0 and number != self._current and not self._closed:
                retire = self._gens.pop(number)
        if retire is not None:
            self._close_generation(retire)

    def stream(self, label: str) -> StreamSwitches:
        with self._lock:
            return self.streams.setdefault(label, StreamSwitches())

    def forget(self, label: str) -> None:
        """Drop ``label``'s figures (a viewer session that ended: a long-running server must not keep them all)."""
        with self._lock:
            self.streams.pop(label, None)

    def stream_items(self) -> list[tuple[str, StreamSwitches]]:
        """A snapshot of :attr:`streams`, sorted by label."""
        with self._lock:
            return sorted(self.streams.items())

    # -- reload ------------------------------------------------------------------------------------------------
    def reload(self, load: Callable[[], Tracker], model: str = "") -> ReloadOutcome:
        """Load a new tracker with ``load()`` beside the running one, check it, install it as the next generation.

        Blocking (the load and the check: about 0.1 s for the tiny test export on a CPU, more for real models); the
        streams keep running on the old model meanwhile and switch at their next frame once it is installed.  Raises
        :class:`ReloadError` when the model is refused, after logging one line; the running model is untouched."""
        if not self._reloading.acquire(blocking=False):
            raise self.refuse("a reload is already under way; wait for it to finish", count=False, busy=True)
        try:
            t0 = time.perf_counter()
            try:
                new = load()
            except Exception as exc:  # any failure to load refuses the model; the deployment must go on
                raise self.refuse(f"it did not load: {describe(exc)}") from exc
            t1 = time.perf_counter()
            if self._closed:
                _close_quietly(new)
                raise self.refuse("the deployment is stopping", count=False)
            try:
                check_tracker(new, self.tracker)
            except Exception as exc:
                _close_quietly(new)
                reason = describe(exc) if isinstance(exc, ReloadError) else f"check failed: {describe(exc)}"
                raise self.refuse(reason) from exc
            t2 = time.perf_counter()
            retire = None
            with self._lock:
                if self._closed:
                    closed = True
                else:
                    closed = False
                    number = max(self._gens) + 1
                    old = self._gens[self._current]
                    self._gens[number] = _Generation(number, new, model)
                    self._current = number
                    if old.refs <= 0:
                        retire = self._gens.pop(old.number)
            if closed:
                _close_quietly(new)
                raise self.refuse("the deployment is stopping", count=False)
            if retire is not None:
                self._close_generation(retire)
            self.stats.reloads += 1
            self.stats.last_load_s, self.stats.last_check_s = t1 - t0, t2 - t1
            self.stats.last_error = None
            logger.info(
                "model reloaded: generation %d%s (load %.3f s, check %.3f s); streams switch at their next frame",
                number,
                f" from {model}" if model else "",
                t1 - t0,
                t2 - t1,
            )
            self._switch_idle_sessions()
            return ReloadOutcome(number, t1 - t0, t2 - t1, model)
        finally:
            self._reloading.release()

    def refuse(self, reason: str, count: bool = True, busy: bool = False) -> ReloadError:
        """Log the one line of a refused reload, count it (``count``) and return the :class:`ReloadError` to raise
        (for a caller whose own preparation failed, e.g. an unreadable deployment file)."""
        message = f"new model refused: {reason}; generation {self._current} keeps running"
        if count:
            self.stats.failed += 1
            self.stats.last_error = message
        logger.error("%s", message)
        return ReloadBusy(message) if busy else ReloadError(message)

    def _switch_idle_sessions(self) -> None:
        with self._lock:
            sessions = list(self._sessions)
        for session in sessions:
            session.switch_if_idle()

    def _register(self, session: _ReloadableSession) -> None:
        with self._lock:
            self._sessions.add(session)

    def _close_generation(self, gen: _Generation) -> None:
        if gen.number == 1 and not self._first_owned:
            return
        try:
            gen.tracker.close()
        except Exception as exc:  # noqa: BLE001 - a retired model failing to close must not stop the streams
            logger.warning("closing model generation %d failed: %s", gen.number, describe(exc))
        else:
            logger.info("model generation %d closed (no stream uses it any more)", gen.number)

    def close(self) -> None:
        """Close every loaded tracker (after every session closed).  Idempotent; later reloads are refused."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            gens, self._gens = list(self._gens.values()), {}
        for gen in gens:
            self._close_generation(gen)


def _close_quietly(tracker: Tracker) -> None:
    try:
        tracker.close()
    except Exception as exc:  # noqa: BLE001 - the refusal is the error worth reporting
        logger.debug("closing a refused model failed: %s", exc)


class _ReloadableSession(TrackerSession):
    """A session on the handle's current generation that moves to the next one at a frame boundary (module doc)."""

    def __init__(self, handle: ModelHandle, label: str) -> None:
        self.handle = handle
        self.label = label
        self.info = handle.stream(label)
        self._lock = threading.RLock()
        self._should_stop: Callable[[], bool] | None = None
        self._waited = 0  # frames waited at this reload for hidden objects to reappear
        self._failed_generation = 0  # a generation that failed on this stream: not retried
        self._closed = False
        # seed "next": the new model's session, armed after frame F, steps F + 1 with these masks as prompts
        self._armed: TrackerSession | None = None
        self._armed_generation = 0
        self._seeds: dict[int, np.ndarray] = {}
        #: controls given to the armed session since it was armed (replayed on the old one if it fails)
        self._since_armed: list[Control] = []
        self._armed_after = -1  # the last frame of the old model
        self._arm_ms = 0.0
        self.generation, tracker = handle.acquire()
        try:
            self.inner = tracker.new_session()
        except BaseException:
            handle.release(self.generation)
            raise
        self.info.generation = self.generation
        handle._register(self)

    @property  # type: ignore[override]
    def should_stop(self) -> Callable[[], bool] | None:
        return self._should_stop

    @should_stop.setter
    def should_stop(self, value: Callable[[], bool] | None) -> None:
        self._should_stop = value
        self.inner.should_stop = value
        if self._armed is not None:
            self._armed.should_stop = value

    # -- TrackerSession --------------------------------------------------------------------------------------
    def add_prompt(self, prompt: Prompt) -> None:
        with self._lock:
            armed = self._armed
            if armed is not None:  # the next frame is the new model's: a prompt for it goes there and wins
                armed.add_prompt(prompt)
                self._seeds.pop(int(prompt.obj_id), None)
                self._since_armed.append(prompt)
                return
            self._switch_if_empty()
            self.inner.add_prompt(prompt)

    def remove_object(self, obj_id: int) -> None:
        with self._lock:
            armed = self._armed
            if armed is not None:
                seeded = self._seeds.pop(int(obj_id), None) is not None
                if not seeded or int(obj_id) in armed.object_ids:
                    armed.remove_object(obj_id)
                self._since_armed.append(RemoveObject(int(obj_id)))
                self._adopt_if_empty()
                return
            self.inner.remove_object(obj_id)
            self._switch_if_empty()

    def reset(self) -> None:
        with self._lock:
            armed = self._armed
            if armed is not None:
                self._seeds.clear()
                armed.reset()
                self._since_armed.append(ResetTracker())
                self._adopt_if_empty()
                return
            self.inner.reset()
            self._switch_if_empty()

    @property
    def object_ids(self) -> list[int]:
        armed = self._armed
        if armed is not None:
            ids = armed.object_ids
            return ids + [oid for oid in list(self._seeds) if oid not in ids]
        return self.inner.object_ids

    def step(self, frame: Frame) -> TrackResult:
        with self._lock:
            if self._armed is not None:
                return self._step_armed(frame)
            result = self.inner.step(frame)
            current = self.handle.generation
            if current != self.generation and current != self._failed_generation:
                self._switch(frame, result)
            return result

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._disarm()
            try:
                self.inner.close()
            finally:
                self.handle.release(self.generation)

    def metrics(self) -> dict[str, object]:
        out = dict(self.inner.metrics() or {})
        out["model_generation"] = self.generation
        out["model_switches"] = self.info.switches
        return out

    # -- switching ---------------------------------------------------------------------------------------------
    def switch_if_idle(self) -> None:
        """Called by the handle right after a reload (another thread): a session that tracks nothing moves now
        instead of holding the old model until its next prompt.  Never waits for a busy session."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            self._switch_if_empty()
        finally:
            self._lock.release()

    def _switch_if_empty(self) -> None:
        if self._closed or self._armed is not None:
            return
        if self.handle.generation in (self.generation, self._failed_generation) or self.inner.object_ids:
            return
        self._install(lambda new: None, frame_index=-1, carried=0)

    def _switch(self, frame: Frame, result: TrackResult) -> None:
        """After frame ``frame`` was tracked by the old model: carry every visible object over (at once with
        seed ``"same"``, else armed for the next frame), or wait a frame for hidden ones to show."""
        t0 = time.perf_counter()
        masks: dict[int, np.ndarray] = {}
        for row, oid in enumerate(result.obj_ids):
            mask = source_mask(result, row, frame.height, frame.width)
            if mask.any():
                masks[int(oid)] = mask
        hidden = [int(oid) for oid in result.obj_ids if int(oid) not in masks]
        if hidden and self._waited < self.handle.absent_grace_frames:
            self._waited += 1  # wait for the hidden objects to show again: their mask is what carries them
            return
        if self.handle.seed == "next":
            moved = self._arm(masks, frame.index, t0)
        else:

            def seed(new: TrackerSession) -> None:
                for oid, mask in masks.items():
                    new.add_prompt(Prompt(oid, frame.index, mask=mask))
                if masks:
                    new.step(frame)  # encodes the masks into the new model's memory; its output is not used

            moved = self._install(seed, frame.index, carried=len(masks), t0=t0)
        if moved and hidden:
            self.info.dropped_objects += len(hidden)
            logger.warning(
                "stream %s: object(s) %s were not visible in the %d frames after the reload and were not "
                "carried over to the new model; prompt them again",
                self.label or "?",
                ", ".join(map(str, hidden)),
                self._waited,
            )

    def _new_session(self) -> tuple[int, TrackerSession] | None:
        """A session on the current generation (counted as used), or None when it is ours already or fails."""
        number, tracker = self.handle.acquire()
        if number == self.generation:
            self.handle.release(number)
            return None
        try:
            new = tracker.new_session()
            new.should_stop = self._should_stop
        except Exception as exc:  # noqa: BLE001 - the stream keeps its old model
            self.handle.release(number)
            self._failed(number, -1, exc)
            return None
        return number, new

    def _failed(self, number: int, frame_index: int, exc: BaseException) -> None:
        self._failed_generation = number
        self.info.failed_switches += 1
        logger.error(
            "stream %s: model generation %d failed%s (%s); this stream keeps generation %d",
            self.label or "?",
            number,
            f" on frame {frame_index}" if frame_index >= 0 else "",
            describe(exc),
            self.generation,
        )

    def _arm(self, masks: dict[int, np.ndarray], frame_index: int, t0: float) -> bool:
        """Seed ``"next"``: open the new model's session now (after frame ``frame_index``); the next frame is
        stepped on it with ``masks`` as prompts."""
        if not masks:  # nothing to carry (every object hidden past the grace period): move now
            return self._install(lambda new: None, frame_index, carried=0, t0=t0)
        opened = self._new_session()
        if opened is None:
            return False
        self._armed_generation, self._armed = opened
        self._armed_after = frame_index
        self._seeds = masks
        self._since_armed = []
        self._waited = 0
        self._arm_ms = (time.perf_counter() - t0) * 1000.0
        return True

    def _adopt_if_empty(self) -> None:
        """The armed session has nothing left to track (every object removed): it will not be stepped until a new
        prompt, so move to it now instead of holding the old model."""
        armed = self._armed
        if armed is None or self._seeds or armed.object_ids:
            return
        old, old_number = self.inner, self.generation
        self.inner, self.generation = armed, self._armed_generation
        self._armed, self._since_armed = None, []
        _close_session_quietly(old)
        self.handle.release(old_number)
        self._moved(self._armed_after, 0, self._arm_ms)

    def _disarm(self) -> None:
        armed, self._armed = self._armed, None
        self._seeds, self._since_armed = {}, []
        if armed is not None:
            _close_session_quietly(armed)
            self.handle.release(self._armed_generation)

    def _step_armed(self, frame: Frame) -> TrackResult:
        armed = self._armed
        assert armed is not None
        t0 = time.perf_counter()
        carried = 0
        try:
            for oid, mask in list(self._seeds.items()):
                if mask.shape != (frame.height, frame.width):  # the feed came back at another size
                    mask = cv2.resize(
                        mask.astype(np.uint8), (frame.width, frame.height), interpolation=cv2.INTER_NEAREST
                    ).astype(bool)
                if mask.any():
                    armed.add_prompt(Prompt(oid, frame.index, mask=mask))
                    carried += 1
                else:  # a speck that vanished in the resize: nothing left to carry
                    self.info.dropped_objects += 1
                    logger.warning(
                        "stream %s: object %d's mask vanished at the new frame size", self.label, oid
                    )
            self._seeds = {}
            seed_ms = (time.perf_counter() - t0) * 1000.0
            result = armed.step(frame)
        except StepAborted:
            raise  # the run is being cancelled; both sessions are closed with this one
        except Exception as exc:  # noqa: BLE001 - the new model failed on a real frame: this one goes to the old
            number, since = self._armed_generation, self._since_armed
            self._disarm()
            self._failed(number, frame.index, exc)
            for msg in since:  # what the user did since the switch was armed, on the old session
                try:
                    if isinstance(msg, Prompt):
                        self.inner.add_prompt(msg)
                    elif isinstance(msg, RemoveObject):
                        self.inner.remove_object(msg.obj_id)
                    else:
                        self.inner.reset()
                except Exception as replay_exc:  # noqa: BLE001 - one bad control must not lose the frame
                    kind = type(msg).__name__
                    logger.warning("stream %s: %s not replayed: %s", self.label or "?", kind, replay_exc)
            return self.inner.step(frame)
        old, old_number = self.inner, self.generation
        self.inner, self.generation = armed, self._armed_generation
        self._armed, self._since_armed = None, []
        t1 = time.perf_counter()
        _close_session_quietly(old)
        self.handle.release(old_number)
        self._moved(self._armed_after, carried, self._arm_ms + seed_ms + (time.perf_counter() - t1) * 1000.0)
        return result

    def _install(
        self, seed: Callable[[TrackerSession], None], frame_index: int, carried: int, t0: float | None = None
    ) -> bool:
        """Open a session on the current generation, ``seed`` it, then retire the old session at once.  False (the
        old session kept) when the new model fails here."""
        t0 = time.perf_counter() if t0 is None else t0
        opened = self._new_session()
        if opened is None:
            return False
        number, new = opened
        try:
            seed(new)
        except StepAborted:  # the run is being cancelled: this frame is dropped anyway; switch another time
            _close_session_quietly(new)
            self.handle.release(number)
            return False
        except Exception as exc:  # noqa: BLE001 - the stream keeps its old model
            _close_session_quietly(new)
            self.handle.release(number)
            self._failed(number, frame_index, exc)
            return False
        old, old_number = self.inner, self.generation
        self.inner, self.generation = new, number
        self._waited = 0
        _close_session_quietly(old)
        self.handle.release(old_number)
        self._moved(frame_index, carried, (time.perf_counter() - t0) * 1000.0)
        return True

    def _moved(self, frame_index: int, carried: int, ms: float) -> None:
        info = self.info
        info.generation = self.generation
        info.switches += 1
        info.last_switch_ms = ms
        info.last_switch_frame = frame_index
        logger.info(
            "stream %s: switched to model generation %d at frame %d (%d object(s) carried, %.1f ms)",
            self.label or "?",
            self.generation,
            frame_index,
            carried,
            ms,
        )


def _close_session_quietly(session: TrackerSession) -> None:
    try:
        session.close()
    except Exception as exc:  # noqa: BLE001 - closing the retired session must not fail the frame
        logger.warning("closing a model session failed: %s", describe(exc))


class ReloadableTracker(Tracker):
    """The handle's model as one stream sees it: sessions follow the handle's reloads (see the module doc).
    ``label`` names the stream in logs and in :attr:`ModelHandle.streams`.  Closing it closes nothing: the handle
    belongs to its owner (the deployment, the viewer server)."""

    def __init__(self, handle: ModelHandle, label: str = "") -> None:
        self.handle = handle
        self.label = label
        self.name = handle.tracker.name

    def input_spec(self, src_w: int, src_h: int) -> InputSpec:
        return self.handle.tracker.input_spec(src_w, src_h)

    def new_session(self) -> TrackerSession:
        return _ReloadableSession(self.handle, self.label)

    def close(self) -> None:
        """Nothing to release here: the handle's owner closes the models."""


__all__ = [
    "ABSENT_GRACE_FRAMES",
    "SEED_MODES",
    "ModelHandle",
    "ReloadBusy",
    "ReloadError",
    "ReloadOutcome",
    "ReloadStats",
    "ReloadableTracker",
    "StreamSwitches",
    "check_tracker",
    "describe_spec",
    "source_mask",
]
